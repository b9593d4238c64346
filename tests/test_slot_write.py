"""The slot-write kernel (a window's projected keys into a head-major cache slot named on the device)
in Triton's CPU interpreter (skipped where Triton is not installed): equal to index_copy_ from the
transposed view bit for bit, every other slot untouched (dev/slot_write_check.py)."""
from dev_checks import run_dev_check


def test_slot_write_in_interpreter():
    out = run_dev_check("slot_write_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "slot write == index_copy_: True", out.stdout
