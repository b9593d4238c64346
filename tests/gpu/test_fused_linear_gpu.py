"""The linears with their activation in the epilogue on CUDA (sm90+): dev/fused_linear_check.py in
float16 and bfloat16 (Parakeet's feed-forward and convolution sizes among its shapes), and a CUDA
graph replay equal to the eager call."""
import pytest
import torch

from dev_checks import run_dev_check
from ostinato.ops.fused_linear import fused_linear_supported, linear_glu, linear_silu

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_kernel():
    probe = torch.empty(1, 8, device="cuda", dtype=torch.float16)
    if not fused_linear_supported(probe, torch.empty(16, 8, device="cuda", dtype=torch.float16)):
        pytest.skip("no Triton, OSTINATO_NO_TRITON=1, or a GPU without TMA")


def test_close_to_float64_on_cuda():
    out = run_dev_check("fused_linear_check.py", interpret=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.strip().endswith("fused linear ok: True")


@pytest.mark.parametrize("op", [linear_silu, linear_glu])
def test_graph_replay_equals_eager(op):
    torch.manual_seed(0)
    x = torch.randn(700, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, 256, device="cuda", dtype=torch.float16) * 0.06
    b = torch.randn(1024, device="cuda", dtype=torch.float16)
    want = op(x, w, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = op(x, w, b)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(got, op(x, w, b)) and not torch.equal(got, want)

