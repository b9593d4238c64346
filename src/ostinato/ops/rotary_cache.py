"""A decode step's queries and keys made ready in one launch: per-head RMSNorm, rotary embedding, and
the step's key and value written into the cache.

Between a layer's fused q/k/v projection and its attention, a decode step normalises each query and
key head, rotates it, and scatters the key and value into the cache at each row's position. Under
torch.compile these were four small kernels a layer (Qwen3-8B at one row on an H100: 218 us of a
6.1-ms step over 36 layers); here one program per (row, head) does a query head, or a key head and
its value head, from the projection's output to where attention reads them.

The arithmetic follows ``models.llm.fusion``: the norm's float32 rstd, the normalised head rounded
to the dtype (then times the weight, or times 1 + weight in float32 for the zero-centred norms of
Qwen3-Next/Qwen3.5), and the rotary embedding on the first 2 * ``inv_freq.shape[0]`` features (the
rest pass) in float32, rounded once, as the compiled chain rounds it. Each program computes its row's
cos and sin itself, as ``rotary_tables`` does (float32 angle position x inverse frequency, rounded
to the dtype): tables made once a step were recomputed by the compiler for many of the layers.

Only CUDA runs the kernel (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check
``can_run`` and otherwise use PyTorch's ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from .triton_support import HAVE_TRITON, kernels_can_run, pdl_options, tl, triton

if HAVE_TRITON:
    from .triton_support import pdl_enter

HEAD_DIMS = (16, 32, 64, 128, 256)

if HAVE_TRITON:

    @triton.jit
    def _normed(x_ptr, d, rstd, w_ptr, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr):
        """Features ``d`` of a head, RMS-normalised as ``fusion.rms_norm`` rounds them (float32 out)."""
        x = tl.load(x_ptr + d)
        if NORM:
            h = x.to(tl.float32) * rstd
            w = tl.load(w_ptr + d).to(tl.float32)
            if ZERO_CENTERED:
                x = (h * (1.0 + w)).to(x.dtype)
            else:
                x = (h.to(x.dtype).to(tl.float32) * w).to(x.dtype)
        return x.to(tl.float32)

    @triton.jit
    def _qk_rotary_cache_kernel(x_ptr, freq_ptr, pos_ptr, qw_ptr, kw_ptr, q_ptr, ck_ptr, cv_ptr,
                                sx, sq_b, sq_h, sck_b, sck_h, sck_s, scv_b, scv_h, scv_s, eps,
                                H: tl.constexpr, Q_STRIDE: tl.constexpr, K_OFF: tl.constexpr, V_OFF: tl.constexpr,
                                D: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr,
                                ZERO_CENTERED: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, head j): j < H normalises and rotates query head j into q[b, j]; j >= H
        does key head j - H into the key cache at the row's position, and copies value head j - H
        into the value cache there."""
        if PDL:
            pdl_enter()
        b = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        d = tl.arange(0, D)
        row = x_ptr + b * sx
        pos = tl.load(pos_ptr + b).to(tl.int64)
        if j < H:
            src = row + j * Q_STRIDE
            w_ptr = qw_ptr
            dst = q_ptr + b * sq_b + j * sq_h
        else:
            kv = (j - H).to(tl.int64)
            src = row + K_OFF + kv * D
            w_ptr = kw_ptr
            dst = ck_ptr + b * sck_b + kv * sck_h + pos * sck_s
            value = tl.load(row + V_OFF + kv * D + d)
            tl.store(cv_ptr + b * scv_b + kv * scv_h + pos * scv_s + d, value)
        rstd = 0.0
        if NORM:
            raw = tl.load(src + d).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(raw * raw, axis=0) / D + eps)
        x = _normed(src, d, rstd, w_ptr, NORM, ZERO_CENTERED)
        rotated = d < 2 * HALF
        first = d < HALF
        partner = tl.where(first, d + HALF, tl.where(rotated, d - HALF, d))
        other = _normed(src, partner, rstd, w_ptr, NORM, ZERO_CENTERED)
        angle = pos.to(tl.float32) * tl.load(freq_ptr + tl.where(first, d, d - HALF), mask=rotated, other=0.0)
        cos = tl.cos(angle).to(x_ptr.dtype.element_ty).to(tl.float32)
        sin = tl.sin(angle).to(x_ptr.dtype.element_ty).to(tl.float32)
        turned = tl.where(first, -other, other)
        out = tl.where(rotated, x * cos + turned * sin, x)
        tl.store(dst + d, out.to(dst.dtype.element_ty))


def can_run(mixed: torch.Tensor, cache_k: torch.Tensor) -> bool:
    """``qk_rotary_cache`` serves these: Triton on their device, one half dtype, a head size it knows."""
    return (kernels_can_run(mixed, mixed.dtype, interpreter=True) and cache_k.dtype == mixed.dtype
            and cache_k.shape[-1] in HEAD_DIMS)


def qk_rotary_cache(mixed: torch.Tensor, inv_freq: torch.Tensor, cache_k: torch.Tensor,
                    cache_v: torch.Tensor, positions: torch.Tensor, heads: int, *, gated: bool = False,
                    q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None,
                    eps: float = 1e-6, zero_centered: bool = False) -> torch.Tensor:
    """The queries [B, heads, D] of one decode step, normalised and rotated; the keys (normalised
    and rotated alike) and the values written into ``cache_k``/``cache_v`` [>= B, kv_heads, S, D] at
    row b's ``positions[b]``.

    mixed [B, Q + 2 * kv_heads * D] is the fused projection's output: the query heads (each followed
    by its output gate when ``gated``: Q = heads * 2D, else heads * D), then the key heads, then the
    value heads, with a contiguous last dimension. inv_freq [R/2] float32 (contiguous) rotates the
    first R features of each head. ``q_norm``/``k_norm`` [D] (both or neither) are the per-head
    RMSNorm weights. Caches of mixed's dtype with a contiguous last dimension; positions an integer
    tensor [B] on mixed's device, each below S.
    """
    bsz = mixed.shape[0]
    kv_heads, dim = cache_k.shape[1], cache_k.shape[3]
    q_stride = 2 * dim if gated else dim
    k_off = heads * q_stride
    if mixed.dim() != 2 or mixed.shape[1] != k_off + 2 * kv_heads * dim or mixed.stride(-1) != 1:
        raise ValueError(f"qk_rotary_cache: mixed {tuple(mixed.shape)} is not [B, {k_off + 2 * kv_heads * dim}] "
                         "with a contiguous last dimension")
    if cache_v.shape != cache_k.shape or cache_k.shape[0] < bsz or dim not in HEAD_DIMS:
        raise ValueError(f"qk_rotary_cache: caches {tuple(cache_k.shape)}, {tuple(cache_v.shape)} do not fit "
                         f"{bsz} rows of head size in {HEAD_DIMS}")
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1 or {cache_k.dtype, cache_v.dtype} != {mixed.dtype}:
        raise ValueError("qk_rotary_cache: the caches need mixed's dtype and a contiguous last dimension")
    half = inv_freq.shape[0]
    if inv_freq.dim() != 1 or 2 * half > dim or inv_freq.dtype != torch.float32 or inv_freq.stride(0) != 1:
        raise ValueError(f"qk_rotary_cache: inv_freq {tuple(inv_freq.shape)} {inv_freq.dtype} is not [<= {dim // 2}] "
                         "float32")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (dim,) or k_norm.shape != (dim,))):
        raise ValueError(f"qk_rotary_cache: q_norm and k_norm must both be [{dim}] weights or both None")
    if positions.shape != (bsz,) or positions.device != mixed.device:
        raise ValueError(f"qk_rotary_cache: positions must be a tensor [{bsz}] on {mixed.device}")
    q = torch.empty(bsz, heads, dim, device=mixed.device, dtype=mixed.dtype)
    if bsz == 0:
        return q
    norm = q_norm is not None
    _qk_rotary_cache_kernel[(bsz, heads + kv_heads)](
        mixed, inv_freq, positions, q_norm if norm else mixed, k_norm if norm else mixed, q, cache_k, cache_v,
        mixed.stride(0), q.stride(0), q.stride(1), cache_k.stride(0), cache_k.stride(1),
        cache_k.stride(2), cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), float(eps),
        H=heads, Q_STRIDE=q_stride, K_OFF=k_off, V_OFF=k_off + kv_heads * dim, D=dim, HALF=half, NORM=norm,
        ZERO_CENTERED=bool(zero_centered), num_warps=1 if dim <= 128 else 2, **pdl_options(mixed.device, bsz))
    return q


@torch.library.custom_op("ostinato::qk_rotary_cache", mutates_args=("cache_k", "cache_v"))
def qk_rotary_cache_op(mixed: torch.Tensor, inv_freq: torch.Tensor, cache_k: torch.Tensor,
                       cache_v: torch.Tensor, positions: torch.Tensor, heads: int, gated: bool,
                       q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                       zero_centered: bool) -> torch.Tensor:
    """``qk_rotary_cache`` as one opaque operator for a compiled decode step (torch.compile would
    otherwise trace into the launcher's checks); it writes the caches in place."""
    return qk_rotary_cache(mixed, inv_freq, cache_k, cache_v, positions, heads, gated=gated, q_norm=q_norm,
                           k_norm=k_norm, eps=eps, zero_centered=zero_centered)


@qk_rotary_cache_op.register_fake
def _(mixed, inv_freq, cache_k, cache_v, positions, heads, gated, q_norm, k_norm, eps, zero_centered):
    return mixed.new_empty((mixed.shape[0], heads, cache_k.shape[-1]))
