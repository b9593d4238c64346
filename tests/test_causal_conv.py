"""A Gated DeltaNet layer's prefill conv on its kernel in Triton's CPU interpreter (skipped where
Triton is not installed): PyTorch's concatenation, conv1d and SiLU, the state untouched
(dev/causal_conv_check.py)."""
from dev_checks import run_dev_check


def test_causal_conv_in_interpreter():
    out = run_dev_check("causal_conv_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "causal conv == reference: True", out.stdout
