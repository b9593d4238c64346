"""decode_attention on CUDA at Whisper's sizes (20 heads of 64, 448 self-attention / 1500
cross-attention keys): float16, bfloat16 and float32 against float64, garbage past int64 lengths,
and a captured CUDA graph replayed with new lengths and contents equal to eager calls."""
import pytest
import torch

from ostinato.ops.decode_attention import decode_attention
from ostinato.ops.triton_support import kernels_can_run

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 6e-3}
HEADS, DIM = 20, 64


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not kernels_can_run("cuda"):
        pytest.skip("Triton is not installed or OSTINATO_NO_TRITON=1")


def reference(q, k, v, lengths):
    s = torch.einsum("bhd,bhsd->bhs", q.double(), k.double()) * q.shape[-1] ** -0.5
    vv = v.double()
    if lengths is not None:
        past = torch.arange(k.shape[2], device=q.device)[None, :] >= lengths[:, None]
        s = s.masked_fill(past[:, None, :], float("-inf"))
        vv = vv.masked_fill(past[:, None, :, None], 0.0)
    return torch.einsum("bhs,bhsd->bhd", torch.softmax(s, dim=-1), vv)


def cache_views(b, seq, dtype, layers=3):
    """k, v: layer 1, rows 1..b of a [2, layers, b + 2, H, S, D] cache, as the decoder holds it."""
    buf = torch.randn(2, layers, b + 2, HEADS, seq, DIM, device="cuda").to(dtype)
    return buf[0, 1, 1:1 + b], buf[1, 1, 1:1 + b]


def garbage_past(k, v, lengths):
    for i, n in enumerate(lengths.tolist()):
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("inf")


def rel_err(got, ref):
    return ((got.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("b,seq", [(1, 448), (1, 1500), (16, 448), (16, 1500)])
def test_matches_float64(b, seq, dtype):
    torch.manual_seed(b * seq)
    k, v = cache_views(b, seq, dtype)
    q = (torch.randn(b, HEADS, DIM, device="cuda") * 2).to(dtype)
    out = decode_attention(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, reference(q, k, v, None)) < TOLERANCE[dtype]
    lengths = torch.randint(1, seq + 1, (b,), device="cuda", dtype=torch.int64)
    lengths[0] = 1
    if b > 1:
        lengths[1] = seq
    garbage_past(k, v, lengths)
    out = decode_attention(q, k, v, lengths)
    assert not out.isnan().any()
    assert rel_err(out, reference(q, k, v, lengths)) < TOLERANCE[dtype]


@pytest.mark.parametrize("b,seq", [(1, 1500), (16, 448)])
def test_cuda_graph_replay_equals_eager(b, seq):
    torch.manual_seed(0)
    k, v = cache_views(b, seq, torch.float16)
    q = torch.randn(b, HEADS, DIM, device="cuda", dtype=torch.float16)
    lengths = torch.full((b,), seq, device="cuda", dtype=torch.int64)
    decode_attention(q, k, v, lengths)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = decode_attention(q, k, v, lengths)
    for step in range(3):
        new_lengths = torch.randint(1, seq + 1, (b,), device="cuda", dtype=torch.int64)
        new_lengths[0] = (1, seq, seq // 3)[step]
        lengths.copy_(new_lengths)
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        garbage_past(k, v, lengths)
        graph.replay()
        eager = decode_attention(q, k, v, lengths)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)
        assert rel_err(static_out, reference(q, k, v, lengths)) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("windows,beams", [(1, 5), (16, 5), (3, 2), (2, 17)])
def test_beams_sharing_cross_kv(windows, beams, dtype):
    """group=beams: every beam of a window attends over the window's one K/V row (the decoder's state
    holds one per window: a view of its first rows; a strided view works alike). Half precision runs
    the tensor-core kernel: a window's rows are the same bits alone as among the others (batched
    decoding equals one window at a time); float32 the CUDA-core one, the same bits as each beam on
    its own copy of the K/V."""
    torch.manual_seed(windows * beams)
    k_rows, v_rows = cache_views(windows * beams, 1500, dtype)
    q = (torch.randn(windows * beams, HEADS, DIM, device="cuda") * 2).to(dtype)
    for k, v in ((k_rows[:windows], v_rows[:windows]), (k_rows[::beams], v_rows[::beams])):
        grouped = decode_attention(q, k, v, group=beams)
        copies_k, copies_v = k.repeat_interleave(beams, 0), v.repeat_interleave(beams, 0)
        assert rel_err(grouped, reference(q, copies_k, copies_v, None)) < TOLERANCE[dtype]
        if dtype == torch.float32:
            assert torch.equal(grouped, decode_attention(q, copies_k, copies_v))
        for w in {0, windows - 1}:
            rows = slice(w * beams, (w + 1) * beams)
            assert torch.equal(grouped[rows], decode_attention(q[rows], k[w:w + 1], v[w:w + 1], group=beams))
    with pytest.raises(ValueError, match="groups of"):
        decode_attention(q[:-1], k, v, group=beams)


def test_grouped_cuda_graph_replay_equals_eager():
    """The tensor-core kernel captured in a graph: replays with new queries and K/V equal eager calls."""
    torch.manual_seed(1)
    windows, beams = 4, 5
    k, v = cache_views(windows, 1500, torch.float16)
    q = torch.randn(windows * beams, HEADS, DIM, device="cuda", dtype=torch.float16)
    decode_attention(q, k, v, group=beams)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = decode_attention(q, k, v, group=beams)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        graph.replay()
        eager = decode_attention(q, k, v, group=beams)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)


@pytest.mark.parametrize("rows", [None, [2, 0, 1]])
def test_prefetched_cross_attention_changes_no_bit(rows):
    """Cross-attention with its K/V lines asked into L2 before the PDL wait (``prefetch=True``; K/V rows
    named on the device or not) equals the same call without, eagerly and replayed in a graph."""
    torch.manual_seed(4)
    k, v = cache_views(3, 1500, torch.float16)
    q = torch.randn(3, HEADS, DIM, device="cuda", dtype=torch.float16)
    kv_rows = torch.tensor(rows, device="cuda") if rows is not None else None
    plain = decode_attention(q, k, v, kv_rows=kv_rows)
    assert torch.equal(decode_attention(q, k, v, kv_rows=kv_rows, prefetch=True), plain)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = decode_attention(q, k, v, kv_rows=kv_rows, prefetch=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, plain)
