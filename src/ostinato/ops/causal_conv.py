"""A Gated DeltaNet layer's causal depthwise convolution over a prefill chunk, in one kernel.

A prompt chunk's q/k/v channels go through a depthwise conv of K taps (K = 4) that starts from the
K-1 inputs each row remembers (its conv state), then SiLU. In PyTorch that was a transpose to
channels-first, a concatenation of the state with the whole chunk (a strided copy of the chunk),
``F.conv1d`` with one group a channel and ``F.silu``, then a transpose back: on an H100, 8.8 ms of a
4096-token Qwen3.5-2B prefill (18 layers). Here one program per (block of tokens, block of channels,
row) reads the chunk in its own layout (tokens x channels, channels contiguous: the projection's
output, any row stride), the remembered inputs for its first K-1 tokens, and writes
silu(conv) rounded as ``F.conv1d`` then ``F.silu`` round it (the sum in float32, rounded to the
dtype, then SiLU in float32, rounded again). The state is not written: the caller keeps the chunk's
last K-1 inputs after the kernel has read the old ones.

Only CUDA runs it (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check ``can_run``
and otherwise use PyTorch's ops (``models.llm.layers.GatedDeltaNet.prefill``).
"""
from __future__ import annotations

import torch

from .triton_support import HAVE_TRITON, kernels_can_run, tl, triton

# A 4096-token Qwen3.5-2B layer (6144 channels) on an H100: 144-154 us at 8 x 128 over 4 warps against
# 547 for PyTorch's concatenation, conv1d and SiLU; 8 x 64 over 2 warps as fast, wider tiles 153-195
# (16 x 256 spills registers: dev/kernel_resources.py)
BLOCK_T = 8  # tokens a program
BLOCK_C = 128  # channels a program
WARPS = 4

if HAVE_TRITON:

    @triton.jit
    def _causal_conv_kernel(x_ptr, state_ptr, rows_ptr, w_ptr, out_ptr, T, C, sxg, sxt, ssb, ssc, sog, sot,
                            K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """Program (token block, channel block, row g): out[g, t, c] = silu(sum_j w[c, j] in(t - K + 1 + j, c))
        with in(tau, c) = x[g, tau, c] for tau >= 0, else the state's cell K - 1 + tau of row rows[g]."""
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        g = tl.program_id(2).to(tl.int64)
        t_ok = t < T
        c_ok = c < C
        row = tl.load(rows_ptr + g).to(tl.int64)
        acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
        for j in tl.static_range(K):
            tau = t - (K - 1) + j
            fresh = (tau >= 0) & t_ok
            xv = tl.load(x_ptr + g * sxg + tau.to(tl.int64)[:, None] * sxt + c[None, :],
                         mask=fresh[:, None] & c_ok[None, :], other=0.0)
            held = (tau < 0) & t_ok
            sv = tl.load(state_ptr + row * ssb + c[None, :] * ssc + (K - 1 + tau)[:, None],
                         mask=held[:, None] & c_ok[None, :], other=0.0)
            w = tl.load(w_ptr + c * K + j, mask=c_ok, other=0.0)
            acc += (xv.to(tl.float32) + sv.to(xv.dtype).to(tl.float32)) * w.to(tl.float32)[None, :]
        y = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        out = (y / (1.0 + tl.exp(-y))).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + g * sog + t.to(tl.int64)[:, None] * sot + c[None, :], out,
                 mask=t_ok[:, None] & c_ok[None, :])


def can_run(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel serves this chunk: Triton on its device, x and the weight in one dtype, channels
    contiguous in x, cells in the state and taps in the weight's rows."""
    return (kernels_can_run(x, interpreter=True) and weight.dtype == x.dtype and x.stride(-1) == 1
            and state.stride(-1) == 1 and weight.reshape(weight.shape[0], -1).stride(-1) == 1)


def causal_conv(x: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(causal depthwise conv) of a chunk x [G, T, C] (contiguous channels, any row and token
    strides) whose rows start from the remembered inputs state[rows] [G, C, K-1]; weight [C, K] (or
    [C, 1, K]); rows [G] (int). Returns [G, T, C] contiguous in x's dtype; the state is only read."""
    groups, tokens, channels = x.shape
    weight = weight.reshape(channels, -1)
    kernel = weight.shape[1]
    if state.shape[1:] != (channels, kernel - 1) or rows.shape != (groups,):
        raise ValueError(f"causal_conv: state {tuple(state.shape)} or rows {tuple(rows.shape)} do not fit "
                         f"{groups} rows of {channels} channels and {kernel} taps")
    out = torch.empty(groups, tokens, channels, device=x.device, dtype=x.dtype)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(tokens, BLOCK_T), triton.cdiv(channels, BLOCK_C), groups)
    _causal_conv_kernel[grid](x, state, rows, weight, out, tokens, channels, x.stride(0), x.stride(1),
                              state.stride(0), state.stride(1), out.stride(0), out.stride(1),
                              K=kernel, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=WARPS)
    return out
