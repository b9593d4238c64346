"""ostinato.ops.skinny on CUDA at Whisper large-v3's decode sizes (d=1280, FF 5120, 51866 tokens):
float16/bfloat16 against float64, first calls under torch's sync-error mode, and a captured CUDA
graph (LayerNorm -> fc1+GELU -> fc2+residual -> LayerNorm -> vocabulary) replayed on new inputs
equal to eager calls."""
import pytest
import torch
import torch.nn.functional as F

from ostinato.ops import skinny
from ostinato.ops.triton_support import kernels_can_run

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
D = 1280
# (N, K, bias, gelu, residual) as the decoder uses them: fused qkv, attention out, fc1, fc2, vocabulary
SHAPES = [(3 * D, D, True, False, False), (D, D, True, False, True), (4 * D, D, True, True, False),
          (D, 4 * D, True, False, True), (51866, D, False, False, False)]


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not kernels_can_run("cuda"):
        pytest.skip("Triton is not installed or OSTINATO_NO_TRITON=1")


def rel_err(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def linear_ref(x, w, b, r, gelu):
    y = x.double() @ w.double().T
    if b is not None:
        y = y + b.double()
    if gelu:
        y = F.gelu(y)
    return y if r is None else y + r.double()


def layer(n, k, dtype, bias):
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
    return w, (torch.randn(n, device="cuda") * 0.5).to(dtype) if bias else None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 16, 80])  # 80: a beam step of 16 windows, K chunks in groups
@pytest.mark.parametrize("n,k,bias,gelu,res", SHAPES, ids=lambda v: str(v))
def test_linear_matches_float64(m, n, k, bias, gelu, res, dtype):
    torch.manual_seed(m * n + k)
    x = torch.randn(m, 1, k + 8, device="cuda").to(dtype)[..., :k]  # [batch, 1, d] view of a wider buffer
    w, b = layer(n, k, dtype, bias)
    r = torch.randn(m, 1, n, device="cuda").to(dtype) if res else None
    out = skinny.linear(x, w, b, residual=r, gelu=gelu)
    assert out.shape == (m, 1, n) and out.dtype == dtype and not out.isnan().any()
    assert rel_err(out, linear_ref(x, w, b, r, gelu)) < TOLERANCE[dtype]
    # other flag combinations on this shape, through NaN-filled outputs
    any_b = b if b is not None else layer(n, k, dtype, True)[1]
    for fb, fg, fr in [(True, True, True), (False, True, False), (False, False, True)]:
        bb = any_b if fb else None
        rr = torch.randn(m, 1, n, device="cuda").to(dtype) if fr else None
        o = torch.full((m, 1, n), float("nan"), device="cuda", dtype=dtype)
        assert skinny.linear(x, w, bb, residual=rr, gelu=fg, out=o) is o
        assert not o.isnan().any() and rel_err(o, linear_ref(x, w, bb, rr, fg)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [40, 80, 150])
@pytest.mark.parametrize("n,k,bias,gelu,res", SHAPES[:4], ids=lambda v: str(v))
def test_a_row_does_not_depend_on_the_others(m, n, k, bias, gelu, res, dtype):
    """Batched decoding equals one window at a time: m rows in one call (several row blocks, K chunks
    in groups) give the bits of the same rows 5 at a time (one row block, one chunk a program)."""
    torch.manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda").to(dtype)
    w, b = layer(n, k, dtype, True)
    r = torch.randn(m, n, device="cuda").to(dtype)
    plan = skinny.linear_plan(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, x.element_size())
    assert plan["m_blocks"] > 1 and plan["group"] > 1  # the grouped path, not the one-row plan
    whole = skinny.linear(x, w, b, residual=r, gelu=True)
    pieces = torch.cat([skinny.linear(x[i:i + 5], w, b, residual=r[i:i + 5], gelu=True) for i in range(0, m, 5)])
    assert torch.equal(whole, pieces)
    assert rel_err(whole, linear_ref(x, w, b, r, True)) < TOLERANCE.get(dtype, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [80, 150, 300])
@pytest.mark.parametrize("n,k", [(1152, 384), (384, 1536)], ids=str)
def test_a_small_product_row_does_not_depend_on_the_others(m, n, k, dtype):
    """tiny.en's products (one K chunk a program, 32-column blocks, up to 64-row blocks for a prefill's
    many rows): m rows at once give the bits of the same rows 5 at a time."""
    torch.manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda").to(dtype)
    w, b = layer(n, k, dtype, True)
    r = torch.randn(m, n, device="cuda").to(dtype)
    plan = skinny.linear_plan(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count,
                              x.element_size(), whole_k=True)
    assert skinny.small_product(n, k, x.element_size()) and plan["block_n"] == 32 and plan["m_blocks"] > 1
    whole = skinny.linear(x, w, b, residual=r, gelu=True)
    pieces = torch.cat([skinny.linear(x[i:i + 5], w, b, residual=r[i:i + 5], gelu=True) for i in range(0, m, 5)])
    assert torch.equal(whole, pieces)
    assert rel_err(whole, linear_ref(x, w, b, r, True)) < TOLERANCE.get(dtype, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_add_layer_norm_matches(m, dtype):
    torch.manual_seed(m)
    x = (torch.randn(m, 1, D, device="cuda") * 3 + 1).to(dtype)
    u = torch.randn(m, 1, D, device="cuda").to(dtype)
    w = (1 + 0.2 * torch.randn(D, device="cuda")).to(dtype)
    b = (0.2 * torch.randn(D, device="cuda")).to(dtype)
    new_ref = x + u
    new_x, y = skinny.add_layer_norm(x, u, w, b, out_residual=x)
    assert new_x is x and torch.equal(x, new_ref)
    assert rel_err(y, F.layer_norm(new_ref.double(), (D,), w.double(), b.double(), 1e-5)) < TOLERANCE[dtype]
    # within one unit in the last place of PyTorch's own half-precision LayerNorm
    t = F.layer_norm(new_ref, (D,), w, b, 1e-5).float()
    ulp = torch.finfo(dtype).eps * torch.maximum(t.abs(), y.float().abs()) + 2**-20
    assert ((y.float() - t).abs() <= ulp).all()
    same, y2 = skinny.add_layer_norm(x, None, w, b)  # plain LayerNorm of the updated x
    assert same is x and ((y2.float() - F.layer_norm(x, (D,), w, b, 1e-5).float()).abs() <= ulp).all()
    # a scaled update (the FastConformer's half-step feed-forward): stored as x.add_(u, alpha=0.5) stores it
    half_ref = x.clone().add_(u, alpha=0.5)
    new_x, y3 = skinny.add_layer_norm(x, u, w, b, out_residual=x, alpha=0.5)
    assert new_x is x and torch.equal(x, half_ref)
    assert rel_err(y3, F.layer_norm(half_ref.double(), (D,), w.double(), b.double(), 1e-5)) < TOLERANCE[dtype]
    # and the next layer's first norm of the stored output, in the same launch: the same bits as a
    # separate launch of the kernel on that output
    w2, b2 = (w.float() * 0.5 + 0.3).to(dtype), (b.float() - 0.1).to(dtype)
    before = x.clone()
    new_x, y4, z = skinny.add_layer_norm(x, u, w, b, out_residual=x, alpha=0.5, then=(w2, b2, 1e-6))
    assert torch.equal(x, before.add_(u, alpha=0.5)) and torch.equal(y4, skinny.add_layer_norm(x, None, w, b)[1])
    assert torch.equal(z, skinny.add_layer_norm(y4, None, w2, b2, 1e-6)[1])
    # the sum not stored (only its norms wanted): the same norms, x untouched
    before = x.clone()
    none, y5, z2 = skinny.add_layer_norm(x, u, w, b, alpha=0.5, then=(w2, b2, 1e-6), store_residual=False)
    assert none is None and torch.equal(x, before)
    assert torch.equal(y5, skinny.add_layer_norm(before.add_(u, alpha=0.5), None, w, b)[1])
    assert torch.equal(z2, skinny.add_layer_norm(y5, None, w2, b2, 1e-6)[1])


def test_first_calls_do_not_sync():
    """Fresh shapes compile and launch while torch raises on any host synchronisation."""
    x = torch.randn(5, D, device="cuda", dtype=torch.float16)
    w, b = layer(777, D, torch.float16, True)
    ln_w = torch.ones(D, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        skinny.add_layer_norm(x, x, ln_w, None)
        skinny.linear(x, w, b, gelu=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 16, 80])
def test_cuda_graph_replay_equals_eager(m, dtype):
    torch.manual_seed(0)
    fc1_w, fc1_b = layer(4 * D, D, dtype, True)
    fc2_w, fc2_b = layer(D, 4 * D, dtype, True)
    voc_w, _ = layer(51866, D, dtype, False)
    ln = [((1 + 0.1 * torch.randn(D, device="cuda")).to(dtype), (0.1 * torch.randn(D, device="cuda")).to(dtype))
          for _ in range(2)]
    x = torch.randn(m, 1, D, device="cuda", dtype=dtype)
    u = torch.randn(m, 1, D, device="cuda", dtype=dtype)

    def step(x, u):
        x, h = skinny.add_layer_norm(x, u, *ln[0], out_residual=x)
        h = skinny.linear(h, fc1_w, fc1_b, gelu=True)
        x = skinny.linear(h, fc2_w, fc2_b, residual=x)
        _, h = skinny.add_layer_norm(x, None, *ln[1])
        return x, skinny.linear(h, voc_w)

    def fresh():
        return torch.randn(m, 1, D, device="cuda", dtype=dtype), torch.randn(m, 1, D, device="cuda", dtype=dtype)

    x0, u0 = fresh()
    x.copy_(x0), u.copy_(u0)
    step(x, u)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_x, static_logits = step(x, u)
    for _ in range(3):
        x0, u0 = fresh()
        x.copy_(x0), u.copy_(u0)
        graph.replay()
        ex, elogits = step(x0.clone(), u0)
        torch.cuda.synchronize()
        assert torch.equal(static_x, ex) and torch.equal(static_logits, elogits)
        h = F.gelu(F.layer_norm((x0 + u0).double(), (D,), ln[0][0].double(), ln[0][1].double(), 1e-5)
                   @ fc1_w.double().T + fc1_b.double())
        ref_x = (x0 + u0).double() + h @ fc2_w.double().T + fc2_b.double()
        assert rel_err(static_x, ref_x) < TOLERANCE[dtype]


@pytest.mark.parametrize("m", [1, 16])
def test_prefetched_weights_change_no_bit(m):
    """A chain of products with their weights asked into L2 before the PDL wait (a Whisper step's
    ``prefetch=True``), captured in a graph as the step is, gives the bits of the chain without it."""
    torch.manual_seed(3)
    fc1_w, fc1_b = layer(4 * D, D, torch.float16, True)
    fc2_w, fc2_b = layer(D, 4 * D, torch.float16, True)
    voc_w, _ = layer(51866, D, torch.float16, False)
    x = torch.randn(m, D, device="cuda", dtype=torch.float16)

    def chain(prefetch):
        h = skinny.linear(x, fc1_w, fc1_b, gelu=True, prefetch=prefetch)
        y = skinny.linear(h, fc2_w, fc2_b, residual=x, prefetch=prefetch)
        return skinny.linear(y, voc_w, prefetch=prefetch)

    plain = chain(False)
    chain(True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = chain(True)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, plain)
    assert torch.equal(chain(True), plain)
