"""The fused decode path as the decoder wires it (fused operators + one-kernel logit rules) against
plain PyTorch on CUDA: dev/whisper_fused_check.py (greedy, beam, sampling, one step's logits)."""
import pytest

from dev_checks import run_dev_check

pytestmark = pytest.mark.gpu


def test_fused_decode_equals_torch_on_cuda():
    out = run_dev_check("whisper_fused_check.py", interpret=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.strip().endswith("fused decode == torch: True")
