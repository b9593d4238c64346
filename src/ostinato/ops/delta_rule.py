"""The gated delta rule as Triton kernels: one decode step, and the chunked (prefill) form's two
halves, everything inside the chunks (``chunk_prepare``) and the chunk-to-chunk scan.

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

Inside the chunks, PyTorch's ops took ~0.9 ms a layer of that prefill (pair decays, norms and
transposes as compiled chains, a batched triangular solve, two float32 products); ``chunk_prepare``
does it all in one kernel a (chunk, row, value head) in 0.24 ms, its float32 tiles a few 64 x 64 at
a time through the head dimension in blocks (whole 64 x 128 tiles spilled hundreds of registers).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .triton_support import HAVE_TRITON, kernels_can_run, sm_count, tl, triton

INTERPRETER_SMS = 132  # the scan's launch is planned as for an H100 under Triton's CPU interpreter

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


if HAVE_TRITON:  # pragma: no cover - needs Triton

    @triton.jit
    def _chunk_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                              u_ptr, w_ptr, qd_ptr, a_ptr, kt_ptr, decay_ptr, scratch_ptr,
                              T, N, s_qb, s_qt, s_qh, s_vb, s_vt, s_vh, s_gb, s_gt,
                              V_HEADS: tl.constexpr, GROUP: tl.constexpr, C: tl.constexpr, BT: tl.constexpr,
                              DK: tl.constexpr, BK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                              SCALE: tl.constexpr, PRECISION: tl.constexpr):
        i = tl.program_id(0)
        bh = tl.program_id(1)
        row = bh // V_HEADS
        head = bh % V_HEADS
        kh = head // GROUP
        c = tl.arange(0, C)
        t = i * C + c
        live = t < T  # the last chunk's padding: no key, no write, no decay
        heads_at = row.to(tl.int64) * s_qb + t[:, None].to(tl.int64) * s_qt + kh * s_qh
        gates = row.to(tl.int64) * s_gb + t.to(tl.int64) * s_gt + head
        g = tl.load(g_ptr + gates, mask=live, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + gates, mask=live, other=0.0).to(tl.float32)
        decay = tl.cumsum(g, 0)  # log of the decay from the chunk's start to each step
        total = tl.sum(g, 0)
        rows = c[:, None]
        cols = c[None, :]
        # the head dimension in blocks of BK (registers): first the rows' norms, then the products
        q_norm = tl.zeros((C,), tl.float32)
        k_norm = tl.zeros((C,), tl.float32)
        for k0 in range(0, DK, BK):
            dk = k0 + tl.arange(0, BK)
            k = tl.load(k_ptr + heads_at + dk[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            q = tl.load(q_ptr + heads_at + dk[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            k_norm += tl.sum(k * k, 1)
            q_norm += tl.sum(q * q, 1)
        k_norm = tl.rsqrt(k_norm + 1e-6)
        q_norm = tl.rsqrt(q_norm + 1e-6) * SCALE
        out = (bh.to(tl.int64) * N + i) * C
        a = tl.zeros((C, C), tl.float32)
        inner = tl.zeros((C, C), tl.float32)
        for k0 in range(0, DK, BK):
            dk = k0 + tl.arange(0, BK)
            k = tl.load(k_ptr + heads_at + dk[None, :], mask=live[:, None], other=0.0).to(tl.float32) * k_norm[:, None]
            q = tl.load(q_ptr + heads_at + dk[None, :], mask=live[:, None], other=0.0).to(tl.float32) * q_norm[:, None]
            a = tl.dot(k * beta[:, None], tl.trans(k), a, input_precision=PRECISION)
            inner = tl.dot(q, tl.trans(k), inner, input_precision=PRECISION)
            keys = out * DK + rows * DK + dk[None, :]
            tl.store(qd_ptr + keys, q * tl.exp(decay)[:, None])
            tl.store(kt_ptr + keys, k * tl.exp(total - decay)[:, None])
        tl.store(decay_ptr + bh.to(tl.int64) * N + i, tl.exp(total))
        # exp(decay_i - decay_j) on and below the diagonal (masked before exp: above it would overflow)
        pair = tl.exp(tl.where(cols <= rows, decay[:, None] - decay[None, :], float("-inf")))
        tl.store(a_ptr + out * C + rows * C + cols, inner * pair)
        # the chunk's system I + A, A strictly lower; its inverse by forward substitution in blocks of
        # BT rows: first the diagonal blocks, all at once, a row at a time, then each later block of
        # rows from the finished ones above it, in products. Both work on a scratch copy (A, then the
        # inverse beside it): Triton cannot slice a tile held in registers, and a few whole tiles would
        # not fit in them. Exact like a triangular solve, no power series (whose terms cancel
        # catastrophically when a chunk's keys are nearly alike)
        a_copy = scratch_ptr + out * 2 * C
        t_copy = a_copy + C * C
        tl.store(a_copy + rows * C + cols, a * tl.where(cols < rows, pair, 0.0))
        tl.debug_barrier()
        nb = tl.arange(0, C // BT)[:, None, None]
        bi = tl.arange(0, BT)[None, :, None]
        bj = tl.arange(0, BT)[None, None, :]
        in_blocks = (nb * BT + bi) * C + nb * BT + bj
        diagonal = tl.load(a_copy + in_blocks)
        blocks = tl.where(bi == bj, 1.0, 0.0) + tl.zeros((C // BT, BT, BT), tl.float32)
        slab = tl.arange(0, BT)[:, None]
        sub = tl.arange(0, BT)[None, :]
        for r in range(BT):
            a_r = tl.sum(tl.where(bi == r, diagonal, 0.0), 1)  # row r of every diagonal block
            solved = tl.where(sub == r, 1.0, 0.0) - tl.sum(a_r[:, :, None] * blocks, 1)
            blocks = tl.where(bi == r, solved[:, None, :], blocks)
        tl.store(t_copy + rows * C + cols, tl.zeros((C, C), tl.float32))
        tl.debug_barrier()
        tl.store(t_copy + in_blocks, blocks)
        tl.debug_barrier()
        for blk in range(1, C // BT):
            top = blk * BT
            a_slab = tl.load(a_copy + (top + slab) * C + cols, mask=cols < top, other=0.0)
            above = tl.dot(a_slab, tl.load(t_copy + rows * C + cols), input_precision=PRECISION)
            own = tl.load(t_copy + (top + slab) * C + top + sub)
            solved = -tl.dot(own, above, input_precision=PRECISION)
            tl.debug_barrier()
            tl.store(t_copy + (top + slab) * C + cols, solved, mask=cols < top)
            tl.debug_barrier()
        inverse = tl.load(t_copy + rows * C + cols)
        # what the inverse is applied to: the written keys decayed (the keys read again, not held)
        # and the written values
        write = beta * tl.exp(decay)
        for k0 in range(0, DK, BK):
            dk = k0 + tl.arange(0, BK)
            k = tl.load(k_ptr + heads_at + dk[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            w = tl.dot(inverse, k * (k_norm * write)[:, None], input_precision=PRECISION)
            tl.store(w_ptr + out * DK + rows * DK + dk[None, :], w)
        for v0 in range(0, DV, BV):
            dv = v0 + tl.arange(0, BV)
            v = tl.load(v_ptr + row.to(tl.int64) * s_vb + t[:, None].to(tl.int64) * s_vt + head * s_vh + dv[None, :],
                        mask=live[:, None], other=0.0).to(tl.float32)
            u = tl.dot(inverse, v * beta[:, None], input_precision=PRECISION)
            tl.store(u_ptr + out * DV + rows * DV + dv[None, :], u)


def can_prepare(q: Tensor, v: Tensor, chunk: int) -> bool:
    """``chunk_prepare`` serves these heads: CUDA with Triton, power-of-two head sizes of 16 to 128, the
    chunk a power-of-two multiple of 16 up to 64, the last dimensions unit-strided."""
    dk, dv = q.shape[-1], v.shape[-1]
    return (kernels_can_run(q) and all(16 <= n <= 128 and n & (n - 1) == 0 for n in (dk, dv))
            and chunk in (16, 32, 64) and q.stride(-1) == 1 and v.stride(-1) == 1
            and v.shape[2] % q.shape[2] == 0)


def chunk_prepare(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int, precision: str,
                  block: int = 32, warps: int = 4):
    """Everything inside the chunks, as ``models.llm.delta_rule.chunk_terms`` and the triangular solves
    after it compute it, in one kernel a (chunk, row, value head): q, k [B, T, Hk, dk] (Hk dividing the
    value heads Hv; a key head serves its group in place), v [B, T, Hv, dv], g, beta [B, T, Hv].
    Returns the scan's arguments but its state: values [B, Hv, n, C, dv]; keys_decayed, q_decayed,
    k_to_end [B, Hv, n, C, dk]; inner [B, Hv, n, C, C]; chunk_decay [B, Hv, n]; all float32."""
    batch, length, key_heads, dk = q.shape
    v_heads, dv = v.shape[2], v.shape[3]
    n = -(-length // chunk)
    g, beta = g.contiguous(), beta.contiguous()
    f32 = dict(dtype=torch.float32, device=q.device)
    values = torch.empty(batch, v_heads, n, chunk, dv, **f32)
    keys_decayed, q_decayed, k_to_end = (torch.empty(batch, v_heads, n, chunk, dk, **f32) for _ in range(3))
    inner = torch.empty(batch, v_heads, n, chunk, chunk, **f32)
    chunk_decay = torch.empty(batch, v_heads, n, **f32)
    scratch = torch.empty(batch, v_heads, n, 2, chunk, chunk, **f32)  # each chunk's system and inverse
    if k.stride() != q.stride():  # one set of strides serves both
        q, k = q.contiguous(), k.contiguous()
    _chunk_prepare_kernel[(n, batch * v_heads)](
        q, k, v, g, beta, values, keys_decayed, q_decayed, inner, k_to_end, chunk_decay, scratch,
        length, n, q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1),
        V_HEADS=v_heads, GROUP=v_heads // key_heads, C=chunk, BT=16, DK=dk, BK=min(dk, block), DV=dv,
        BV=min(dv, block), SCALE=dk ** -0.5, PRECISION=precision, num_warps=warps)
    return values, keys_decayed, q_decayed, inner, k_to_end, chunk_decay


def can_scan(state: Tensor, chunk: int) -> bool:
    """``chunk_scan`` serves this state: CUDA with Triton, float32, power-of-two sizes of 16 or more."""
    dk, dv = state.shape[-2:]
    return (kernels_can_run(state) and state.dtype == torch.float32
            and all(n >= 16 and n & (n - 1) == 0 for n in (dk, dv, chunk)))


def scan_block(programs_at_16: int, dv: int, sms: int) -> int:
    """Value columns a scan program takes: 16, or 32 where 16 would launch more programs than the
    device has SMs (each program walks every chunk of its head in turn, so a second wave waits for
    the whole first). 4096-token layers on an H100 (132 SMs), TF32: Qwen3.5-2B's 16 heads 0.48 ms at
    16 (128 programs) against 0.54 at 32; Qwen3.5-35B-A3B's 32 heads 0.78 ms at 16 (256 programs)
    against 0.57 at 32; 64 columns 0.59-0.72 ms for either (dev/llm_prefill_timing.py)."""
    return 16 if programs_at_16 <= sms or dv < 32 else 32


def chunk_scan(values: Tensor, keys_decayed: Tensor, q_decayed: Tensor, inner: Tensor, k_to_end: Tensor,
               chunk_decay: Tensor, state: Tensor, block: Optional[int] = None, warps: int = 8,
               precision: str = "ieee"):
    """The scan of ``models.llm.delta_rule.scan_chunks`` as one kernel. values [B, H, n, C, dv];
    keys_decayed, q_decayed, k_to_end [B, H, n, C, dk]; inner [B, H, n, C, C]; chunk_decay
    [B, H, n]; state [B, H, dk, dv]: all float32. Returns (out [B, H, n, C, dv], final state).
    ``block``: value columns a program (None: ``scan_block``'s choice)."""
    # 8 warps a program: measured on an H100 (dev/llm_prefill_timing.py) at 0.9 ms for a 4k-token layer
    # against 15 ms for the PyTorch loop; tiles wider than 32 columns spill registers. (Split in a
    # sequential kernel for the states and a parallel one for the outputs, it read out of bounds on an
    # H100 in TF32 under Triton 3.6, for some shapes and not others: not kept)
    batch, heads, n, chunk, dv = values.shape
    dk = keys_decayed.shape[-1]
    if block is None:  # (can_scan: dv is 16 or more)
        block = scan_block(batch * heads * dv // 16, dv, sm_count(values.device, INTERPRETER_SMS))
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
