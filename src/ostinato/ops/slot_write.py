"""Write one window's projected keys or values into a slot of a head-major cache, the slot read on the device.

A window's cross-attention keys come out of their projection as rows [S, H*D] (position-major) and
live in the cache as [slots, H, S, D] (head-major, as attention reads them). ``index_copy_`` from the
transposed view gathers with a stride per element (7.6 us for large-v3's 3.8 MB on an H100); here
one program copies a block of positions of one head, whole D-vectors at a time (2.4 us). The slot
is read from the device, so one captured graph serves every slot.

Only CUDA runs the kernel (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check
``triton_support.kernels_can_run`` and otherwise use ``index_copy_``.
"""
from __future__ import annotations

import torch

from .triton_support import HAVE_TRITON, tl, triton

BLOCK_S = 64  # positions per program
NUM_WARPS = 4

if HAVE_TRITON:

    @triton.jit
    def _slot_write_kernel(src_ptr, dst_ptr, slot_ptr, S, s_src, s_slot, s_head, s_pos,
                           D: tl.constexpr, BLOCK_S: tl.constexpr):
        """Program (block of positions, head h): src[s, h*D : (h+1)*D] -> dst[slot, h, s, :]."""
        block = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64)
        slot = tl.load(slot_ptr).to(tl.int64)
        pos = (block * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
        d = tl.arange(0, D)
        ok = (pos < S)[:, None]
        x = tl.load(src_ptr + pos[:, None] * s_src + head * D + d[None, :], mask=ok)
        tl.store(dst_ptr + slot * s_slot + head * s_head + pos[:, None] * s_pos + d[None, :], x, mask=ok)


def write_slot(src: torch.Tensor, dst: torch.Tensor, slot: torch.Tensor) -> None:
    """``dst[slot] = src`` seen as [S, H, D] with heads first: src [1, S, H*D] or [S, H*D] with a
    contiguous last dimension; dst [slots, H, S, D] of src's dtype with a contiguous last dimension
    and a power-of-two D; slot a one-element integer tensor on dst's device."""
    rows = src.reshape(-1, src.shape[-1])
    slots, heads, seq, dim = dst.shape
    if rows.shape != (seq, heads * dim) or rows.dtype != dst.dtype:
        raise ValueError(f"write_slot: src {tuple(src.shape)} {src.dtype} does not fit dst {tuple(dst.shape)} {dst.dtype}")
    if rows.stride(-1) != 1 or dst.stride(-1) != 1 or dim & (dim - 1):
        raise ValueError("write_slot: src and dst need a contiguous last dimension, D a power of two")
    if slot.numel() != 1 or slot.dtype not in (torch.int32, torch.int64):
        raise ValueError("write_slot: slot must be a one-element integer tensor")
    _slot_write_kernel[(triton.cdiv(seq, BLOCK_S), heads)](
        rows, dst, slot, seq, rows.stride(0), dst.stride(0), dst.stride(1), dst.stride(2),
        D=dim, BLOCK_S=BLOCK_S, num_warps=NUM_WARPS)
