"""Check ostinato.ops.moe_decode (a routed MoE block's decode step: routing, the chosen experts'
gate/up and down products, the shared expert and the residual add) against PyTorch.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/moe_decode_check.py   # CPU, float16
    PYTHONPATH=src python dev/moe_decode_check.py                                     # on a GPU, + bfloat16

For MoE blocks of random weights (with and without a shared expert, inner sizes that differ,
renormalised top-k or not, 1 to 16 tokens):
  * routing: the kernel's experts have torch.topk's probabilities of the float32 softmax (logits
    equal in the dtype tie, and each breaks ties its own way: the kernel takes the lower index, checked
    on logits made equal), its weights those probabilities (renormalised) rounded to the dtype;
  * the block: ``MoE.decode`` on the kernels (the RMSNorm applied on load from square sums) against
    the module's PyTorch path (``MoE.forward`` on the normed stream, plus the stream), within a few
    roundings of the dtype, for the tokens whose routing the two paths agree on (a rounding
    difference in the router may pick another expert on a near-tie; at least 90% must agree), and
    the returned square sums equal to those of the output.
Ends with ``moe decode == reference: True`` (exit 1 otherwise).
"""
import sys

import torch

from ostinato.models.llm.config import LLMConfig
from ostinato.models.llm.layers import MoE, Normed, RMSNorm
from ostinato.ops import moe_decode
from decode_attention_check import run_half_cases

# (tokens, hidden, experts, top k, inner, shared inner or 0, renormalise)
CASES = [
    (1, 256, 32, 4, 64, 64, True),
    (3, 128, 16, 2, 32, 48, True),  # the tiny checkpoints' kind: shared inner larger
    (16, 128, 8, 2, 64, 0, True),  # Qwen3-MoE: no shared expert
    (5, 192, 24, 3, 96, 32, False),
]


def moe_block(hidden, experts, top_k, inner, shared_inner, normalize, device, dtype):
    config = LLMConfig(kind="qwen3_5_moe", architecture="test", vocab_size=8, hidden_size=hidden, num_layers=1,
                       num_heads=1, num_kv_heads=1, head_dim=8, intermediate_size=inner, num_experts=experts,
                       experts_per_token=top_k, moe_intermediate_size=inner,
                       shared_expert_intermediate_size=shared_inner, norm_topk_prob=normalize, rms_norm_eps=1e-6,
                       rope_theta=1e4, rotary_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
    block = MoE(config)
    g = torch.Generator().manual_seed(hidden + experts)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    block = block.to(device=device, dtype=dtype)
    block.fuse()
    return block


def check(device, dtype, tokens, hidden, experts, top_k, inner, shared_inner, normalize) -> bool:
    block = moe_block(hidden, experts, top_k, inner, shared_inner, normalize, device, dtype)
    norm = RMSNorm(hidden, 1e-6, zero_centered=True).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden) * 0.2)
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    square_sums = x.float().pow(2).reshape(tokens, -1, 16).sum(-1)  # parts, as a product returns them
    stream = Normed(x, square_sums, norm)
    with torch.no_grad():
        got, got_ss = block.decode(stream)
        normed = norm(x)
        want = x + block(normed, True)
        logits = torch.nn.functional.linear(normed, block.gate.weight)
    # routing alone, on the PyTorch path's logits
    ids, weights = moe_decode.route(logits, top_k, normalize, dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top, chosen = torch.topk(probs, top_k, dim=-1)
    if normalize:
        top = top / top.sum(-1, keepdim=True)
    # logits equal in the dtype tie; torch.topk breaks ties its own way, so compare what was chosen
    picked = probs.gather(-1, ids.long())
    if normalize:
        picked = picked / picked.sum(-1, keepdim=True)
    routing_ok = (torch.allclose(picked, top, rtol=1e-5, atol=1e-7)
                  and torch.allclose(weights, top.to(dtype).float(), rtol=1e-2, atol=1e-3))
    # the block, for the tokens both paths route alike
    fused_ids, _ = moe_decode.route(block_router_logits(block, stream), top_k, normalize, dtype)
    alike = (fused_ids.long().sort(-1).values == chosen.sort(-1).values).all(-1)
    scale = want.float().abs().amax(-1, keepdim=True)
    err = ((got.float() - want.float()).abs() / scale).amax(-1)
    tol = 2.0 ** (-5 if dtype == torch.bfloat16 else -8)  # a few roundings of the experts' sum
    block_ok = bool((err[alike] <= tol).all()) and alike.double().mean().item() >= 0.9
    ss_ok = torch.allclose(got_ss.sum(-1), got.float().pow(2).sum(-1), rtol=1e-4)
    ok = routing_ok and block_ok and ss_ok
    print(f"tokens {tokens:2d} hidden {hidden} experts {experts} top {top_k} inner {inner} shared {shared_inner} "
          f"renormalised {normalize} {str(dtype)[6:]}: routing {'ok' if routing_ok else 'FAIL'}, "
          f"{int(alike.sum())}/{tokens} routed alike, worst {err[alike].max().item():.2e}, square sums "
          f"{'ok' if ss_ok else 'FAIL'}: {'ok' if ok else 'FAIL'}")
    return ok


def block_router_logits(block, stream):
    """The router logits the fused path computes (the skinny product on the normed stream)."""
    from ostinato.models.llm.layers import project_normed

    out = project_normed(stream, block.router_in)
    start = 2 * block.shared_expert.down_proj.weight.shape[1] if block.shared_expert is not None else 0
    return out[:, start:start + block.experts]


def ties_go_to_the_lower_index(device) -> bool:
    """Equal logits: the kernel takes the lower expert index first (torch.topk's order is its own); NaN
    logits name experts that exist."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    ids, weights = moe_decode.route(logits.half(), 4, False, torch.float16)
    ok = ids.tolist() == [[1, 2, 4, 5], [0, 1, 2, 3]] and bool((weights[1] == weights[1, 0]).all())
    # NaN logits (an overflowed stream) must still name experts that exist, never one past the end
    nan_ids, _ = moe_decode.route(torch.full((1, 6), float("nan"), device=device).half(), 4, True, torch.float16)
    ok &= bool(((nan_ids >= 0) & (nan_ids < 6)).all())
    print(f"ties to the lower index, NaN logits in range: {'ok' if ok else 'FAIL'} ({ids.tolist()})")
    return ok


def main() -> int:
    ties = []

    def check_with_ties(device, dtype, *case):
        if not ties:
            ties.append(ties_go_to_the_lower_index(device))
        return check(device, dtype, *case) and ties[0]

    return run_half_cases(moe_decode.HAVE_TRITON, CASES, check_with_ties, "moe decode == reference")


if __name__ == "__main__":
    sys.exit(main())
