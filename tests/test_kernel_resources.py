"""The LLM decode and prefill kernels compile for a Hopper GPU on this machine (Triton's compiler and
ptxas; skipped where Triton is not installed) without spilling registers: a type error or a spill the
CPU interpreter cannot show (dev/kernel_resources.py)."""
from dev_checks import run_dev_check


def test_llm_kernels_compile_for_sm90_without_spills():
    out = run_dev_check("kernel_resources.py", interpret=False, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "every kernel compiles for sm_90: True", out.stdout
    rows = [line for line in lines[1:-1] if line.split()]
    assert len(rows) >= 7
    assert all(int(line[48:].split()[1]) == 0 for line in rows), out.stdout  # the spilled bytes column
