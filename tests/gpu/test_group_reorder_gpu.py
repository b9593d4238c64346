"""The beam-reorder kernel on CUDA: dev/group_reorder_check.py (large-v3 and tiny.en beam sizes
among its cases), and a captured graph replayed with new origins equal to index_select."""
import pytest
import torch

from dev_checks import run_dev_check
from ostinato.ops import group_reorder
from ostinato.ops.triton_support import kernels_can_run

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not kernels_can_run("cuda"):
        pytest.skip("Triton is not installed or OSTINATO_NO_TRITON=1")


def test_reorder_equals_index_select_on_cuda():
    out = run_dev_check("group_reorder_check.py", interpret=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.strip().endswith("group reorder == index_select: True")


def test_graph_replay_with_new_origins():
    torch.manual_seed(0)
    windows, beams = 3, 5
    caches = [torch.randn(4, windows * beams, 6, 64, 64, device="cuda", dtype=torch.float16) for _ in range(2)]
    views = [c[:, :, :, :32] for c in caches]
    origin = torch.arange(windows * beams, device="cuda")
    group_reorder.reorder_in_groups(views, origin, beams)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        group_reorder.reorder_in_groups(views, origin, beams)
    for _ in range(3):
        pick = torch.randint(0, beams, (windows, beams), device="cuda")
        origin.copy_((torch.arange(windows, device="cuda")[:, None] * beams + pick).flatten())
        want = [v.index_select(1, origin) for v in views]
        graph.replay()
        torch.cuda.synchronize()
        for v, w in zip(views, want):
            assert torch.equal(v, w)
