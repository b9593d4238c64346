"""runtime.uploads on the CPU: padded batches in order, rows zero-padded, values unchanged (the CUDA
path, worker thread and side stream, is tests/gpu/test_transducer_gpu.py's)."""
import numpy as np
import torch

from ostinato.runtime import host_values_to_device, padded_host_batch, upload_batches


def test_padded_host_batch_pads_with_zeros_and_casts():
    arrays = [np.arange(1, 4, dtype=np.float32), np.array([7, -2], dtype=np.float64), np.ones(5, np.float32)]
    got = padded_host_batch(arrays, pinned=False)
    assert got.dtype == torch.float32 and got.shape == (3, 5)
    assert got.tolist() == [[1, 2, 3, 0, 0], [7, -2, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_upload_batches_in_order_on_the_cpu():
    rng = np.random.default_rng(0)
    batches = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for sizes in ((3, 9), (4,), (2, 2, 6))]
    got = list(upload_batches(batches, torch.device("cpu")))
    assert len(got) == 3
    for batch, arrays in zip(got, batches):
        assert batch.shape == (len(arrays), max(a.shape[0] for a in arrays))
        for i, a in enumerate(arrays):
            assert torch.equal(batch[i, : a.shape[0]], torch.from_numpy(a))
            assert not batch[i, a.shape[0]:].any()
    assert list(upload_batches([], torch.device("cpu"))) == []


def test_host_values_to_device():
    got = host_values_to_device([3, 0, 12], torch.device("cpu"))
    assert got.dtype == torch.int64 and got.tolist() == [3, 0, 12]
    rows = host_values_to_device([[0.5, 1.0], [0.25, 2.0]], torch.device("cpu"), torch.float32)
    assert rows.dtype == torch.float32 and rows.tolist() == [[0.5, 1.0], [0.25, 2.0]]


def test_prepare_gets_each_batch_and_its_arrays():
    batches = [[np.ones(3, np.float32), np.ones(1, np.float32)], [np.full(2, 2.0, np.float32)]]
    got = list(upload_batches(batches, torch.device("cpu"), prepare=lambda batch, arrays: (batch.sum(1), len(arrays))))
    assert [(s.tolist(), n) for s, n in got] == [([3.0, 1.0], 2), ([4.0], 1)]


def test_host_tensor_to_device_keeps_values_and_dtype():
    from ostinato.runtime import host_tensor_to_device

    host = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    got = host_tensor_to_device(host, torch.device("cpu"))
    assert got.dtype == torch.int16 and got.device.type == "cpu" and torch.equal(got, host)
    mel = torch.randn(1, 80, 30)
    assert torch.equal(host_tensor_to_device(mel, "cpu"), mel)
