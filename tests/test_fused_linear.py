"""The linears with their activation in the epilogue (ops/fused_linear.py): the kernels in Triton's CPU
interpreter against float64 (skipped where Triton is not installed; dev/fused_linear_check.py), and
the PyTorch path they take where the kernels cannot run."""
import torch
import torch.nn.functional as F

from dev_checks import run_dev_check
from ostinato.ops.fused_linear import fused_linear_supported, linear_glu, linear_silu


def test_kernels_in_interpreter():
    out = run_dev_check("fused_linear_check.py", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "fused linear ok: True", out.stdout


def test_cpu_and_float32_take_the_pytorch_path():
    x, w, b = torch.randn(5, 16), torch.randn(24, 16), torch.randn(24)
    assert not fused_linear_supported(x, w)
    assert torch.equal(linear_silu(x, w, b), F.silu(x @ w.t() + b))
    assert torch.equal(linear_glu(x, w, b), F.glu(x @ w.t() + b, dim=-1))
