"""A routed MoE block's decode step on its kernels (routing, the chosen experts' products with the
RMSNorm and SwiGLU on load, the shared expert, the residual add) in Triton's CPU interpreter
(skipped where Triton is not installed): the experts torch.topk picks, and the module's PyTorch
output within float16 rounding (dev/moe_decode_check.py)."""
from dev_checks import run_dev_check


def test_moe_decode_in_interpreter():
    out = run_dev_check("moe_decode_check.py", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "moe decode == reference: True", out.stdout
