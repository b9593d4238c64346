"""The prefill's pointwise kernels in Triton's CPU interpreter (skipped where Triton is not installed):
SwiGLU against ``F.silu(gate) * up`` and the MoE prefill's combine of expert-sorted rows against the
copy back to token order and batched product it replaces (dev/prefill_kernels_check.py)."""
from dev_checks import run_dev_check


def test_prefill_kernels_in_interpreter():
    out = run_dev_check("prefill_kernels_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "prefill kernels == reference: True", out.stdout
