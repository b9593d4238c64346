"""A language model's fused decode step (skinny projections with the norms, SwiGLU and residual adds
folded in; grouped-query attention) in Triton's CPU interpreter against the same step on PyTorch's
ops, on the tiny checkpoints in float16 (dev/llm_fused_check.py; skipped where Triton is not
installed)."""
from dev_checks import run_dev_check


def test_fused_decode_step_in_interpreter():
    out = run_dev_check("llm_fused_check.py", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "fused decode == plain decode: True", out.stdout
