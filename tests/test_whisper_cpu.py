"""The CPU's shortcuts in the Whisper decode step give the plain step's results, and loading a model
leaves PyTorch's compiler unimported (it costs seconds of every start)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ostinato.models.whisper.config import WhisperDims
from ostinato.models.whisper.modules import Whisper
from ostinato.ops.cpu_linear import FEW_ROWS
from ostinato.testing.random_models import random_whisper_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# Whisper's vocabulary and contexts, a narrow model: the step's shapes without its cost.
DIMS = WhisperDims(80, 1500, 64, 2, 2, 51865, 448, 64, 2, 2)


@pytest.fixture(scope="module")
def decoder():
    dims, state = random_whisper_checkpoint(DIMS, dtype=torch.float32)
    return Whisper.from_state_dict(dims, state).decoder.eval()


def _inputs(windows: int, beams: int, seed: int = 0):
    """A step of ``windows`` x ``beams`` rows: each window's beams share their cross-attention K/V,
    and the self-attention caches hold values up to each row's position."""
    g = torch.Generator().manual_seed(seed)
    rows, heads, d = windows * beams, DIMS.n_text_head, DIMS.n_text_state // DIMS.n_text_head
    cross = [torch.randn(windows, heads, DIMS.n_audio_ctx, d, generator=g).repeat_interleave(beams, 0)
             for _ in range(2 * DIMS.n_text_layer)]
    caches = [torch.randn(rows, heads, DIMS.n_text_ctx, d, generator=g) for _ in range(2 * DIMS.n_text_layer)]
    tokens = torch.randint(0, 50000, (rows, 1), generator=g)
    positions = torch.randint(1, 60, (rows, 1), generator=g)
    return tokens, positions, caches, cross


def _run(decoder, tokens, positions, caches, cross, **kwargs):
    caches = [c.clone() for c in caches]
    n = DIMS.n_text_layer
    with torch.inference_mode():
        logits = decoder(tokens, positions, caches[:n], caches[n:], cross[:n], cross[n:], **kwargs)
    return logits, caches


def test_shared_cross_attention_and_filled_keys_give_the_plain_step(decoder):
    tokens, positions, caches, cross = _inputs(windows=2, beams=5)
    plain, plain_caches = _run(decoder, tokens, positions, caches, cross)
    # grouped: one cross-attention row per window, as the decoder's state holds them
    fast, fast_caches = _run(decoder, tokens, positions, caches, [c[::5].clone() for c in cross], filled=64,
                             cross_group=5)
    assert torch.allclose(fast, plain, rtol=0, atol=1e-5)
    assert torch.equal(fast.argmax(-1), plain.argmax(-1))
    for a, b in zip(fast_caches, plain_caches):  # this step's keys and values written alike
        assert torch.allclose(a, b, rtol=0, atol=1e-5)
    assert torch.equal(fast_caches[0], plain_caches[0])  # the first layer's: before any shortcut


def test_few_rows_project_like_many(decoder):
    # Up to FEW_ROWS rows the vocabulary projection is weight @ x^T (one row as two): the same
    # logits, up to the last bits, as the rows get inside a larger call.
    tokens, positions, caches, cross = _inputs(windows=FEW_ROWS + 2, beams=1)
    many, _ = _run(decoder, tokens, positions, caches, cross)
    for rows in (1, 5):
        few, _ = _run(decoder, tokens[:rows], positions[:rows], [c[:rows] for c in caches], [c[:rows] for c in cross])
        assert torch.allclose(few, many[:rows], rtol=0, atol=1e-5)
        assert torch.equal(few.argmax(-1), many[:rows].argmax(-1))


def test_loading_a_model_does_not_import_the_compiler():
    checkpoint = ROOT / "tests" / "data" / "checkpoints" / "openai" / "tiny-random.pt"
    code = ("import sys; from ostinato import WhisperModel; WhisperModel(sys.argv[1], device='cpu'); "
            "sys.exit('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(checkpoint)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 0, done.stderr[-2000:] or "torch._dynamo was imported while loading"
