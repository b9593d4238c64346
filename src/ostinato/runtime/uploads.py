"""Host arrays to the device without stalling it: padded batches filled into pinned memory by a worker
thread, copied (and optionally first processed) on a side stream, so that the host's fill, the copy
and that first step of one batch overlap the device's work on the batch before. On the CPU the same
calls give plain padded tensors."""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from . import pinned_ring
from .device import side_stream


def padded_host_batch(arrays: Sequence[np.ndarray], pinned: bool) -> Tensor:
    """[B, longest] float32 on the host (pinned if asked), each 1-D array's row zero-padded."""
    width = max(int(a.shape[0]) for a in arrays)
    host = torch.empty(len(arrays), width, dtype=torch.float32, pin_memory=pinned)
    for i, a in enumerate(arrays):  # torch's copy runs on several threads (a large numpy one on one)
        host[i, : a.shape[0]].copy_(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
        host[i, a.shape[0]:].zero_()
    return host


def host_values_to_device(values: Sequence, device: torch.device, dtype: torch.dtype = torch.int64) -> Tensor:
    """A small tensor of ``values`` (numbers, or equal-length lists of them) on ``device`` without
    waiting for the device (``torch.tensor(values, device=cuda)`` copies from pageable memory and so
    waits for all queued work)."""
    return host_tensor_to_device(torch.tensor(values, dtype=dtype), device)


def host_tensor_to_device(tensor: Tensor, device) -> Tensor:
    """``tensor`` on ``device``; from the host to a GPU through pinned memory (``pinned_ring``), so the
    call returns without waiting for the work queued on the current stream (a copy from pageable
    memory waits for it). The copy is ordered on the current stream like any other work."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return pinned_ring.upload(tensor, device)


def upload_batches(batches: Iterable[Sequence[np.ndarray]], device: torch.device, ahead: int = 2,
                   prepare: Optional[Callable[[Tensor, Sequence[np.ndarray]], Any]] = None) -> Iterator[Any]:
    """Each batch of 1-D arrays as a padded [B, longest] float32 tensor on ``device``, in order, ready
    for the current stream; or what ``prepare(batch, arrays)`` makes of it (tensors, or a tuple or
    list of them), run right after the copy on the same stream.

    On CUDA a worker thread fills up to ``ahead`` batches into pinned memory ahead of the caller, and
    the next batch's copy and ``prepare`` are launched on a side stream before the current one is
    yielded: they run while the caller's stream works on the current batch, which waits only for its
    own batch's event."""
    if device.type != "cuda":
        for arrays in batches:
            batch = padded_host_batch(arrays, pinned=False).to(device)
            yield batch if prepare is None else prepare(batch, arrays)
        return
    consumer = torch.cuda.current_stream(device)
    side = side_stream(device, "uploads")
    batches = iter(batches)
    filling: deque = deque()  # (arrays, future of the pinned batch)
    launched: deque = deque()  # (result, event) whose copy and prepare are on the side stream
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ostinato-upload") as pool:
        def fill_next() -> None:
            arrays = next(batches, None)
            if arrays is not None:
                filling.append((arrays, pool.submit(padded_host_batch, arrays, True)))

        def launch_next() -> None:
            if not filling:
                return
            arrays, future = filling.popleft()
            fill_next()
            host = future.result()
            with torch.cuda.stream(side):
                batch = host.to(device, non_blocking=True)
                result = batch if prepare is None else prepare(batch, arrays)
                done = torch.cuda.Event()
                done.record(side)
            for tensor in _tensors(result):  # made on the side stream, read on the consumer's
                tensor.record_stream(consumer)
            launched.append((result, done))

        for _ in range(max(1, ahead)):
            fill_next()
        launch_next()
        while launched:
            launch_next()  # the next batch's copy and prepare go ahead of the caller's work on this one
            result, done = launched.popleft()
            consumer.wait_event(done)
            yield result


def _tensors(result) -> List[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    return [t for t in result if isinstance(t, Tensor)] if isinstance(result, (tuple, list)) else []
