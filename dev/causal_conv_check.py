"""Check ostinato.ops.causal_conv (a Gated DeltaNet layer's causal depthwise conv over a prefill chunk,
from each row's remembered inputs, then SiLU) against PyTorch's concatenation, F.conv1d and F.silu.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/causal_conv_check.py   # CPU, float16
    PYTHONPATH=src python dev/causal_conv_check.py                                     # on a GPU, + bfloat16

Chunks of 1, 2 (fewer tokens than the taps' memory), 37 and 300 tokens; channel counts that do not fill a
program's block; rows taken from a larger state in another order; the chunk a strided view of a wider
projection, as the layer passes it. The output within one rounding of the dtype (the two sum the
taps in different orders), the state untouched. Ends with ``causal conv == reference: True``.
"""
import sys

import torch
import torch.nn.functional as F

from ostinato.ops import causal_conv
from decode_attention_check import run_half_cases

# (rows, spare state rows, tokens, channels, taps)
CASES = [(1, 1, 1, 96, 4), (2, 1, 2, 300, 4), (3, 2, 37, 256, 4), (1, 0, 300, 520, 4), (2, 0, 5, 64, 3)]


def check(device, dtype, rows, spare, tokens, channels, taps) -> bool:
    width = channels + 70  # the projection holds more than the conv's channels
    proj = torch.randn(rows, tokens, width, device=device).to(dtype)
    x = proj[..., 5:5 + channels]
    state = torch.randn(rows + spare, channels, taps - 1, device=device).to(dtype)
    before = state.clone()
    order = torch.randperm(rows + spare, device=device)[:rows]
    weight = (torch.randn(channels, 1, taps, device=device) * 0.5).to(dtype)
    got = causal_conv.causal_conv(x, state, order, weight)
    window = torch.cat((state[order], x.transpose(1, 2)), dim=-1)
    want = F.silu(F.conv1d(window.float(), weight.float(), groups=channels)).transpose(1, 2)
    err = ((got.float() - want).abs().max() / want.abs().max()).item()
    tol = 2.0 ** (-6 if dtype == torch.bfloat16 else -9)
    ok = err <= tol and torch.equal(state, before) and got.is_contiguous()
    print(f"rows {rows}+{spare} tokens {tokens:3d} channels {channels} taps {taps} {str(dtype)[6:]}: "
          f"worst {err:.1e}, state {'untouched' if torch.equal(state, before) else 'CHANGED'}: {'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    return run_half_cases(causal_conv.HAVE_TRITON, CASES, check, "causal conv == reference")


if __name__ == "__main__":
    sys.exit(main())
