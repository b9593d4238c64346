"""Check ostinato.ops.gated_delta_decode (a Gated DeltaNet layer's decode step between its products:
the causal conv over the rolling state, the gates, the gated delta rule and the gated output norm)
against the layer's PyTorch path.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/gated_delta_check.py   # CPU, float16
    PYTHONPATH=src python dev/gated_delta_check.py                                     # on a GPU, + bfloat16

A random layer (key heads shared by two value heads, or not) steps rows of random streams from
random conv and recurrent states (with spare rows the step must not touch), three steps in a row,
both ways: the conv state equal bit for bit (it only moves inputs), the recurrent state within
float32 rounding of the inputs' dtype, the layer's output within a few roundings of the dtype.
Ends with ``gated delta decode == reference: True`` (exit 1 otherwise).
"""
import sys

import torch

from ostinato.models.llm.config import LLMConfig
from ostinato.models.llm.layers import GatedDeltaNet, Normed, RMSNorm
from ostinato.ops import gated_delta_decode
from decode_attention_check import run_half_cases

# (rows, spare rows, hidden, key heads, value heads, key dim, value dim)
CASES = [(1, 1, 128, 2, 4, 32, 32), (3, 2, 64, 2, 2, 16, 16), (4, 0, 96, 1, 2, 64, 32),
         (2, 1, 64, 2, 2, 16, 128)]  # a value head of 4 blocks: the last to finish applies the norm


def layer(hidden, k_heads, v_heads, dk, dv, device, dtype):
    config = LLMConfig(kind="qwen3_5", architecture="test", vocab_size=8, hidden_size=hidden, num_layers=1,
                       num_heads=1, num_kv_heads=1, head_dim=8, intermediate_size=8, rms_norm_eps=1e-6,
                       rope_theta=1e4, rotary_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                       linear_num_key_heads=k_heads, linear_num_value_heads=v_heads, linear_key_head_dim=dk,
                       linear_value_head_dim=dv, linear_conv_kernel=4)
    net = GatedDeltaNet(config)
    g = torch.Generator().manual_seed(hidden + dk)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if name in ("A_log", "dt_bias") else p.shape[-1] ** -0.5))
    net = net.to(device=device, dtype=dtype)
    net.fuse()
    return net


def check(device, dtype, rows, spare, hidden, k_heads, v_heads, dk, dv) -> bool:
    net = layer(hidden, k_heads, v_heads, dk, dv, device, dtype)
    norm = RMSNorm(hidden, 1e-6, zero_centered=True).to(device=device, dtype=dtype)
    conv = torch.randn(rows + spare, net.conv_dim, net.kernel - 1, device=device).to(dtype)
    rec = torch.randn(rows + spare, v_heads, dk, dv, device=device) * 0.3
    states = {"fused": (conv.clone(), rec.clone()), "plain": (conv.clone(), rec.clone())}
    outs = {"fused": [], "plain": []}
    xs = [torch.randn(rows, hidden, device=device).to(dtype) for _ in range(3)]
    can = gated_delta_decode.can_run
    for path in ("fused", "plain"):
        if path == "plain":
            gated_delta_decode.can_run = lambda *args: False
        c, r = states[path]
        with torch.no_grad():
            for x in xs:
                outs[path].append(net.decode(Normed(x, None, norm), c[:rows], r[:rows])[0])
        gated_delta_decode.can_run = can
    (fc, fr), (pc, pr) = states["fused"], states["plain"]
    conv_ok = torch.equal(fc.view(torch.uint8), pc.view(torch.uint8))
    rec_err = ((fr - pr).abs().max() / pr.abs().max()).item()
    out_err = max(((f.float() - p.float()).abs().max() / p.float().abs().max()).item()
                  for f, p in zip(outs["fused"], outs["plain"]))
    tol = 2.0 ** (-6 if dtype == torch.bfloat16 else -9)
    ok = conv_ok and rec_err <= tol and out_err <= tol and torch.equal(fr[rows:], rec[rows:])
    print(f"rows {rows}+{spare} hidden {hidden} heads {k_heads}/{v_heads} dk {dk} dv {dv} {str(dtype)[6:]}: conv state "
          f"{'equal' if conv_ok else 'DIFFERS'}, recurrent state {rec_err:.1e}, output {out_err:.1e}: "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    return run_half_cases(gated_delta_decode.HAVE_TRITON, CASES, check, "gated delta decode == reference")


if __name__ == "__main__":
    sys.exit(main())
