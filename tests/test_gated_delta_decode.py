"""A Gated DeltaNet layer's decode step on its kernels (the causal conv over the rolling state, the
gates and the gated delta rule) in Triton's CPU interpreter (skipped where Triton is not installed):
the layer's PyTorch path, the conv state bit for bit (dev/gated_delta_check.py)."""
from dev_checks import run_dev_check


def test_gated_delta_decode_in_interpreter():
    out = run_dev_check("gated_delta_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "gated delta decode == reference: True", out.stdout
