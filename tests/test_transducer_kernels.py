"""The transducer's Triton kernels in Triton's CPU interpreter (skipped where Triton is not installed):
fused decode step == PyTorch step (RNN-T and TDT, max_symbols forcing, odd steps per replay), the
conv-module kernel and the relative-position attention bias against float32 PyTorch."""
from dev_checks import run_dev_check


def test_fused_kernels_in_interpreter():
    out = run_dev_check("transducer_fused_check.py", timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.count("fused == torch: True") == 2, out.stdout
