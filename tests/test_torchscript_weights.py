"""audio.torchscript_weights: a TorchScript archive's tensors read without TorchScript equal what
``torch.jit.load`` gives, and an archive that names anything else is refused, not run."""
import pickle
import zipfile

import pytest
import torch

from ostinato.audio import vad
from ostinato.audio.torchscript_weights import ArchiveError, read_tensors


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 5)
        self.rnn = torch.nn.LSTM(4, 6)
        self.register_buffer("basis", torch.randn(2, 7, dtype=torch.float64))

    def forward(self, x):
        return self.rnn(self.conv(x).transpose(1, 2))[0] * self.basis.sum().float()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(6, 6), torch.nn.Linear(6, 2)])
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))
        self.register_buffer("empty", torch.zeros(0))

    def forward(self, x):
        h = self.first(x)
        for layer in self.layers:
            h = layer(h)
        return h


def test_the_tensors_equal_torch_jit_loads_state_dict(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "net.jit"
    torch.jit.save(torch.jit.script(Net()), str(path))
    expected = torch.jit.load(str(path)).state_dict()
    got = read_tensors(path)
    assert set(expected) <= set(got)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_an_archive_naming_another_global_is_refused(tmp_path):
    import os

    path = tmp_path / "odd.jit"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("odd/data.pkl", pickle.dumps({"call": os.getcwd}))
    with pytest.raises(ArchiveError, match="unexpected global"):
        read_tensors(path)
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as archive:
        archive.writestr("x/readme.txt", "no pickle here")
    with pytest.raises(ArchiveError, match="not a TorchScript archive"):
        read_tensors(plain)


@pytest.mark.skipif(not vad.torch_weights_available(), reason="silero-vad 6.0/6.1 is not installed")
def test_silero_vads_weights_equal_torch_jit_and_fall_back_to_it(monkeypatch):
    path = vad.model_file("torch")
    reference = {k[len("_model."):]: v for k, v in torch.jit.load(str(path)).state_dict().items()
                 if k.startswith("_model.")}
    read = vad._silero_weights(path)
    assert set(read) == set(reference) and all(torch.equal(read[k], reference[k]) for k in reference)
    from ostinato.audio import torchscript_weights

    def refuse(_):
        raise ArchiveError("a layout this reader does not know")

    monkeypatch.setattr(torchscript_weights, "read_tensors", refuse)
    fallen_back = vad._silero_weights(path)
    assert all(torch.equal(fallen_back[k], reference[k]) for k in reference)
