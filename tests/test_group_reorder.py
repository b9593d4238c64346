"""The beam-reorder kernel in Triton's CPU interpreter (skipped where Triton is not installed):
rows reordered within their groups equal ``index_select`` bit for bit, only the view is written
(dev/group_reorder_check.py)."""
from dev_checks import run_dev_check


def test_group_reorder_in_interpreter():
    out = run_dev_check("group_reorder_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "group reorder == index_select: True", out.stdout
