"""One decode step of the gated delta rule as one Triton kernel.

PyTorch ops read and write each row's recurrent state (heads x dk x dv, float32) several times per
step (decay, the remembered value, the update, the output); this kernel reads each state tile once
into registers, does all four, and writes it back once. Key heads shared by several value heads
(GQA-style) are read in place, without repeating them. Graph-safe; the PyTorch version
(``models.llm.delta_rule.recurrent_delta_step``) is the reference and the fallback.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import HAVE_TRITON, kernels_can_run, tl, triton

if HAVE_TRITON:  # pragma: no cover - needs Triton

    @triton.jit
    def _delta_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
                           s_qb, s_qh, s_vb, s_vh, s_gb, s_sb, s_sh, s_ob, s_oh,
                           V_HEADS: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                           BV: tl.constexpr, SCALE: tl.constexpr):
        pid = tl.program_id(0)
        row = pid // V_HEADS
        head = pid % V_HEADS
        kh = head // GROUP
        vb = tl.program_id(1)
        dk = tl.arange(0, DK)
        dv = vb * BV + tl.arange(0, BV)
        q = tl.load(q_ptr + row * s_qb + kh * s_qh + dk).to(tl.float32)
        k = tl.load(k_ptr + row * s_qb + kh * s_qh + dk).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * SCALE
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = tl.load(v_ptr + row * s_vb + head * s_vh + dv).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + row * s_gb + head).to(tl.float32))
        beta = tl.load(beta_ptr + row * s_gb + head).to(tl.float32)
        tile = state_ptr + row * s_sb + head * s_sh + dk[:, None] * DV + dv[None, :]
        s = tl.load(tile) * decay
        remembered = tl.sum(s * k[:, None], 0)
        delta = (v - remembered) * beta
        s = s + k[:, None] * delta[None, :]
        tl.store(tile, s)
        out = tl.sum(s * q[:, None], 0)
        tl.store(out_ptr + row * s_ob + head * s_oh + dv, out.to(out_ptr.dtype.element_ty))


def can_run(state: Tensor, dk: int, dv: int) -> bool:
    """The kernel serves this state: CUDA with Triton, power-of-two head sizes, dv a multiple of 16."""
    return (kernels_can_run(state) and state.dtype == torch.float32 and dk & (dk - 1) == 0
            and dv % 16 == 0 and state.stride(-1) == 1 and state.stride(-2) == dv)


def delta_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> Tensor:
    """q, k [B, Hk, dk]; v [B, Hv, dv]; g, beta [B, Hv] (g float32, log decay); state [B, Hv, dk, dv]
    float32, updated in place. Returns the output [B, Hv, dv] in v's dtype."""
    rows, v_heads, dv = v.shape
    dk = q.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.contiguous(), beta.contiguous()
    out = torch.empty_like(v)
    block = 32 if dv % 32 == 0 else 16
    _delta_step_kernel[(rows * v_heads, dv // block)](
        q, k, v, g, beta, state, out,
        q.stride(0), q.stride(1), v.stride(0), v.stride(1), g.stride(0), state.stride(0), state.stride(1),
        out.stride(0), out.stride(1),
        V_HEADS=v_heads, GROUP=v_heads // q.shape[1], DK=dk, DV=dv, BV=block, SCALE=dk ** -0.5,
        num_warps=4)
    return out
