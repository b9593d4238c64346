"""ops.attention on CUDA: no cuDNN kernel runs (cuDNN builds a plan for every new shape), the
results equal float64 attention, and PyTorch's backend choice is left as it was."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ostinato.ops.attention import attention

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def kernels_of(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def inputs(queries, keys, masked):
    gen = torch.Generator(device="cuda").manual_seed(queries * 1000 + keys)
    q = torch.randn(2, 6, queries, 64, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(2, 6, keys, 64, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(2, 6, keys, 64, device="cuda", dtype=torch.float16, generator=gen)
    mask = None
    if masked:  # query i sees the keys up to keys - queries + i, as a prompt over a cache
        mask = torch.arange(keys, device="cuda")[None, :] <= torch.arange(keys - queries, keys, device="cuda")[:, None]
    return q, k, v, mask


@pytest.mark.parametrize("queries,keys,masked", [(13, 13, False), (13, 448, True), (29, 1500, False)])
def test_varying_shapes_run_no_cudnn_kernel_and_are_right(queries, keys, masked):
    q, k, v, mask = inputs(queries, keys, masked)
    causal = masked is False and queries == keys
    names = kernels_of(lambda: attention(q, k, v, attn_mask=mask, is_causal=causal))
    assert names and not any("cudnn" in n.lower() for n in names), names
    out = attention(q, k, v, attn_mask=mask, is_causal=causal)
    s = (q.double() @ k.double().transpose(-1, -2)) * 64 ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(queries, keys, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    expected = torch.softmax(s, dim=-1) @ v.double()
    assert (out.double() - expected).abs().max().item() < 2e-3


def test_the_backend_choice_is_restored_after_a_call():
    q, k, v, _ = inputs(8, 8, False)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    attention(q, k, v)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
