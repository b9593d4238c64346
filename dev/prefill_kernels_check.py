"""Check the prefill's pointwise kernels against PyTorch: ``ops.swiglu`` (silu(gate) * up) and
``ops.moe_combine`` (each token's k expert outputs, weighted and summed, from expert-sorted rows).

    TRITON_INTERPRET=1 PYTHONPATH=src:dev:/path/to/triton python dev/prefill_kernels_check.py   # CPU, float16
    PYTHONPATH=src:dev python dev/prefill_kernels_check.py                                     # on a GPU, + bfloat16

* swiglu: against ``F.silu(gate) * up`` (each op rounded to the dtype) for 2-D and 3-D products, a
  width that is no multiple of the kernel's block, and rows read from a wider buffer (a row stride of
  their own): at most one unit in the dtype's last place apart (float32 exp may differ in its last
  bit from PyTorch's), 99% or more equal.
* combine: against the PyTorch path it replaces (the rows copied back to token order with
  ``index_copy_``, then each token's k rows times its k weights in a float32 batched product),
  for routings with repeated and unused experts: within two roundings of the dtype.
* the MoE block's grouped prefill (bfloat16 on a GPU with torch's grouped GEMM only): the kernels'
  output against the same block with both kernels switched off.
Ends with ``prefill kernels == reference: True`` (exit 1 otherwise).
"""
import sys

import torch
import torch.nn.functional as F

from ostinato.ops import moe_combine, swiglu
from decode_attention_check import run_half_cases

# (leading shape, inner size, row padding)
SWIGLU_CASES = [((7,), 1000, 0), ((3, 5), 64, 0), ((4,), 2048, 6), ((1,), 1, 0)]
# (tokens, experts, top k, hidden)
COMBINE_CASES = [(9, 4, 2, 130), (33, 8, 4, 2048), (1, 3, 3, 64)]


def ulp(dtype):
    return torch.finfo(dtype).eps


def check_swiglu(device, dtype, lead, inner, pad):
    g = torch.Generator().manual_seed(inner + pad)
    wide = (torch.randn(*lead, 2 * inner + pad, generator=g) * 3).to(device=device, dtype=dtype)
    x = wide[..., : 2 * inner]
    if not swiglu.can_run(x):
        print(f"swiglu {lead} x {2 * inner} (+{pad}) {dtype}: the kernel does not serve it")
        return False
    got = swiglu.swiglu(x)
    gate, up = x.chunk(2, dim=-1)
    want = F.silu(gate) * up
    diff = (got.float() - want.float()).abs()
    within = bool((diff <= ulp(dtype) * want.float().abs().clamp_min(1.0) * 1.01).all())
    equal = (got == want).float().mean().item()
    ok = within and equal >= 0.99 and got.shape == want.shape and got.is_contiguous()
    print(f"swiglu {lead} x {2 * inner} (+{pad}) {dtype}: {equal:.2%} equal, largest difference "
          f"{diff.max().item():.2e}: {'ok' if ok else 'FAILED'}")
    return ok


def reference_combine(y, order, weights):
    tokens, top_k = weights.shape
    rows = torch.empty_like(y).index_copy_(0, order, y)
    return torch.bmm(weights[:, None, :].to(y.dtype), rows.view(tokens, top_k, -1)).squeeze(1)


def check_combine(device, dtype, tokens, experts, top_k, hidden):
    g = torch.Generator().manual_seed(tokens * experts + hidden)
    chosen = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    chosen[0] = chosen[-1]  # two tokens with the same experts
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1).to(device=device, dtype=dtype)
    order = torch.argsort(chosen.reshape(-1).to(device), stable=True)
    y = torch.randn(tokens * top_k, hidden, generator=g).to(device=device, dtype=dtype)
    if not moe_combine.can_run(y):
        print(f"combine {tokens} tokens {dtype}: the kernel does not serve it")
        return False
    got = moe_combine.combine_sorted(y, order, weights)
    want = reference_combine(y, order, weights)
    scale = want.float().abs().clamp_min(1.0)
    err = ((got.float() - want.float()).abs() / scale).max().item()
    ok = err <= 2 * ulp(dtype) and got.shape == want.shape
    print(f"combine {tokens} tokens, {experts} experts, top {top_k}, {hidden} wide, {dtype}: "
          f"largest difference {err:.2e} of the dtype's {ulp(dtype):.1e}: {'ok' if ok else 'FAILED'}")
    return ok


def check_grouped_block(device):
    """The MoE block's grouped prefill with the kernels against it with them off (bfloat16, GPU)."""
    from moe_decode_check import moe_block
    from ostinato.models.llm import fusion
    from ostinato.models.llm.layers import grouped_mm_available

    if not grouped_mm_available(device, torch.bfloat16):
        print("grouped MoE block: torch's grouped GEMM does not run here, not checked")
        return True
    block = moe_block(256, 32, 4, 128, 64, True, device, torch.bfloat16)
    block.grouped = True
    x = torch.randn(300, 256, device=device, generator=torch.Generator(device).manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        got = block(x, False)
        can_combine, can_swiglu = moe_combine.can_run, swiglu.can_run
        moe_combine.can_run = swiglu.can_run = lambda *a: False
        try:
            with fusion.enabled(False):
                want = block(x, False)
        finally:
            moe_combine.can_run, swiglu.can_run = can_combine, can_swiglu
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    ok = err < 1e-2
    print(f"grouped MoE block, 300 tokens, bfloat16: relative difference {err:.2e}: {'ok' if ok else 'FAILED'}")
    return ok


def check(device, dtype, kind, *case):
    if kind == "swiglu":
        return check_swiglu(device, dtype, *case)
    if kind == "combine":
        return check_combine(device, dtype, *case)
    return check_grouped_block(device) if dtype == torch.bfloat16 else True


def main() -> int:
    cases = [("swiglu", *c) for c in SWIGLU_CASES] + [("combine", *c) for c in COMBINE_CASES] + [("block",)]
    return run_half_cases(swiglu.HAVE_TRITON, cases, check, "prefill kernels == reference")


if __name__ == "__main__":
    sys.exit(main())
