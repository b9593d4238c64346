"""The Silero VAD in PyTorch on CUDA (the ``torch`` backend) against faster-whisper's probabilities.

The references (tests/data/refs/faster_whisper_vad_tiny_en.json) hold faster-whisper's own speech
probabilities (onnxruntime, CPU) on the VAD tests' two recordings, and the speech spans it found
with several VadOptions. The device machine has no PyAV: OSTINATO_CLIP_SAMPLES names the folder of
int16 .npy clips that dev/export_device_bundle.py writes; the recordings are built from those.
The torch backend's weights come from the silero-vad package (6.0 or 6.1) on the path.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato.audio import vad
from ostinato.testing.recordings import build, fingerprint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not vad.torch_weights_available(), reason="silero-vad 6.0/6.1 is not installed"),
]
REFS = Path(__file__).resolve().parents[1] / "data" / "refs" / "faster_whisper_vad_tiny_en.json"


def _recordings(refs):
    folder = os.environ.get("OSTINATO_CLIP_SAMPLES")
    where = {"clip_dir": folder} if folder else {}
    if not folder:
        pytest.importorskip("av")
    for name, meta in refs["recordings"].items():
        audio = build(name, **where)
        assert fingerprint(audio) == meta["sha256"]
        yield name, audio


def test_torch_vad_on_cuda_matches_faster_whisper():
    refs = json.loads(REFS.read_text())
    network = vad.load_vad("cuda", "torch")
    assert vad.resolve_backend("auto", "cuda") == "torch"
    for name, audio in _recordings(refs):
        expected = refs["vad"][name]
        probs = vad.speech_probabilities(audio, network)
        assert probs.shape == (audio.shape[0] // 512 + 1,)
        np.testing.assert_allclose(probs[:: expected["probability_stride"]], expected["probabilities"],
                                   atol=1e-4, rtol=0)
        for case, want in expected["cases"].items():
            spans = vad.speech_spans(probs, audio.shape[0], vad.vad_options(want["options"]))
            assert [list(s) for s in spans] == want["spans"], (name, case)


def test_torch_vad_cpu_and_cuda_agree():
    rng = np.random.RandomState(5)
    audio = (rng.standard_normal(16000 * 20 + 77) * 0.1).astype(np.float32)
    cpu = vad.speech_probabilities(audio, vad.load_vad("cpu", "torch"))
    cuda = vad.speech_probabilities(audio, vad.load_vad("cuda", "torch"))
    np.testing.assert_allclose(cuda, cpu, atol=1e-4, rtol=0)


def test_an_hour_on_cuda():
    """An hour of audio (112,500 windows: more than cuDNN takes as one LSTM sequence) runs, and its
    first ten minutes have the probabilities of those ten minutes alone (the state carries across)."""
    rng = np.random.RandomState(11)
    minute = (rng.standard_normal(16000 * 60) * 0.05).astype(np.float32)
    hour = np.tile(minute, 60)
    network = vad.load_vad("cuda", "torch")
    probs = vad.speech_probabilities(hour, network)
    assert probs.shape == (hour.shape[0] // 512 + 1,) and np.isfinite(probs).all()
    ten = vad.speech_probabilities(hour[: 16000 * 600], network)
    np.testing.assert_allclose(probs[: ten.shape[0] - 1], ten[:-1], atol=1e-5, rtol=0)


def test_a_model_load_on_cuda_prepares_the_vad(tmp_path, monkeypatch):
    from ostinato import WhisperModel
    from ostinato.testing.random_models import save_random_whisper_checkpoint

    monkeypatch.delenv("OSTINATO_VAD_BACKEND", raising=False)
    vad._load.cache_clear()
    model = WhisperModel(save_random_whisper_checkpoint("tiny", str(tmp_path / "tiny.pt")), device="cuda")
    assert vad._load.cache_info().currsize == 1  # made by the load's helper
    network = vad.load_vad(model.device)
    assert isinstance(network, vad.TorchSilero) and vad._load.cache_info().hits == 1
