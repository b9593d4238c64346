"""The gated delta rule's sequential parts as Triton kernels: one decode step, and the chunk-to-chunk
scan of the chunked (prefill) form.

PyTorch ops read and write each row's recurrent state (heads x dk x dv, float32) several times per
step (decay, the remembered value, the update, the output); this kernel reads each state tile once
into registers, does all four, and writes it back once. Key heads shared by several value heads
(GQA-style) are read in place, without repeating them. Graph-safe; the PyTorch version
(``models.llm.delta_rule.recurrent_delta_step``) is the reference and the fallback.

The chunked form does everything inside a chunk as batched matmuls over all chunks at once; what is
left is a scan that carries the state from one chunk to the next (three small matmuls and a decay
per chunk). As PyTorch ops that is ~10 launches per chunk per layer, and a 4k-token prompt spends
most of its prefill launching them; ``chunk_scan`` runs the whole scan of a layer as one kernel, the
state tile kept in registers from the first chunk to the last. Its matmuls run in IEEE float32, as
the PyTorch loop (``models.llm.delta_rule.scan_chunks``) does, for float32 models, and in TF32 for
half-precision ones (whose inputs carry 8-11 bits): a 4096-token Qwen3.5-2B layer's scan went from
0.68 to 0.43 ms on an H100.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import HAVE_TRITON, kernels_can_run, tl, triton

if HAVE_TRITON:  # pragma: no cover - needs Triton

    @triton.jit
    def delta_update(tile, s, q, k, v, decay, beta, SCALE: tl.constexpr):
        """One gated delta rule step on the state tile s [DK, BV] loaded from ``tile`` (float32): q, k
        (float32 [DK]) L2-normalised (q also scaled), the state decayed, the value k remembers replaced
        by beta's share of v, the tile written back once; returns the tile's output for q (float32 [BV])."""
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * SCALE
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        s = s * decay
        remembered = tl.sum(s * k[:, None], 0)
        delta = (v - remembered) * beta
        s = s + k[:, None] * delta[None, :]
        tl.store(tile, s)
        return tl.sum(s * q[:, None], 0)

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
        v = tl.load(v_ptr + row * s_vb + head * s_vh + dv).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + row * s_gb + head).to(tl.float32))
        beta = tl.load(beta_ptr + row * s_gb + head).to(tl.float32)
        tile = state_ptr + row * s_sb + head * s_sh + dk[:, None] * DV + dv[None, :]
        out = delta_update(tile, tl.load(tile), q, k, v, decay, beta, SCALE)
        tl.store(out_ptr + row * s_ob + head * s_oh + dv, out.to(out_ptr.dtype.element_ty))


if HAVE_TRITON:  # pragma: no cover - needs Triton

    @triton.jit
    def _chunk_scan_kernel(u_ptr, w_ptr, qd_ptr, a_ptr, kt_ptr, decay_ptr, state_ptr, out_ptr, N,
                           C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                           PRECISION: tl.constexpr):
        bh = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, C)
        dk = tl.arange(0, DK)
        dv = tl.program_id(1) * BV + tl.arange(0, BV)
        tile = state_ptr + bh * DK * DV + dk[:, None] * DV + dv[None, :]
        s = tl.load(tile)
        for i in range(N):
            chunk = bh * N + i
            keys = chunk * C * DK + c[:, None] * DK + dk[None, :]
            values = chunk * C * DV + c[:, None] * DV + dv[None, :]
            # the chunk's values less what the state already holds for its (decayed) keys
            new_v = tl.load(u_ptr + values) - tl.dot(tl.load(w_ptr + keys), s, input_precision=PRECISION)
            out = tl.dot(tl.load(qd_ptr + keys), s, input_precision=PRECISION)
            inner = tl.load(a_ptr + chunk * C * C + c[:, None] * C + c[None, :])
            out += tl.dot(inner, new_v, input_precision=PRECISION)
            tl.store(out_ptr + values, out)
            k_to_end = tl.load(kt_ptr + keys)
            s = s * tl.load(decay_ptr + chunk) + tl.dot(tl.trans(k_to_end), new_v, input_precision=PRECISION)
        tl.store(tile, s)


def can_scan(state: Tensor, chunk: int) -> bool:
    """``chunk_scan`` serves this state: CUDA with Triton, float32, power-of-two sizes of 16 or more."""
    dk, dv = state.shape[-2:]
    return (kernels_can_run(state) and state.dtype == torch.float32
            and all(n >= 16 and n & (n - 1) == 0 for n in (dk, dv, chunk)))


def chunk_scan(values: Tensor, keys_decayed: Tensor, q_decayed: Tensor, inner: Tensor, k_to_end: Tensor,
               chunk_decay: Tensor, state: Tensor, block: int = 16, warps: int = 8, precision: str = "ieee"):
    """The scan of ``models.llm.delta_rule.scan_chunks`` as one kernel. values [B, H, n, C, dv];
    keys_decayed, q_decayed, k_to_end [B, H, n, C, dk]; inner [B, H, n, C, C]; chunk_decay
    [B, H, n]; state [B, H, dk, dv]: all float32. Returns (out [B, H, n, C, dv], final state)."""
    # 16 value columns and 8 warps a program: measured on an H100 (dev/llm_prefill_timing.py) at 0.9 ms
    # for a 4k-token layer against 15 ms for the PyTorch loop; wider tiles spill registers
    batch, heads, n, chunk, dv = values.shape
    dk = keys_decayed.shape[-1]
    state = state.contiguous().clone()
    # row-major like the kernel's inputs (solve_triangular may hand back column-major values)
    out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    block = min(block, dv)
    args = [x.contiguous() for x in (values, keys_decayed, q_decayed, inner, k_to_end, chunk_decay)]
    _chunk_scan_kernel[(batch * heads, dv // block)](*args, state, out, n, C=chunk, DK=dk, DV=dv, BV=block,
                                                     PRECISION=precision, num_warps=warps, num_stages=1)
    return out, state


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
