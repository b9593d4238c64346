"""A decode step's token + position embedding in one kernel, in Triton's CPU interpreter (skipped where
Triton is not installed): PyTorch's half-precision sum bit for bit, and the rows' key counts
(dev/embedding_check.py)."""
from dev_checks import run_dev_check


def test_embedding_in_interpreter():
    out = run_dev_check("embedding_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "embedding == torch: True", out.stdout
