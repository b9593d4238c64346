"""A decode step's q/k RMSNorms, rotary embedding and K/V cache writes in one kernel, in Triton's CPU
interpreter (skipped where Triton is not installed): equal to PyTorch's norm, rotary and scatter
within one rounding, every other cache entry untouched (dev/rotary_cache_check.py)."""
from dev_checks import run_dev_check


def test_rotary_cache_in_interpreter():
    out = run_dev_check("rotary_cache_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "rotary cache == reference: True", out.stdout
