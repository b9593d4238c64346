"""Reorder rows within their groups, in place, rewriting only the rows that move.

Beam search keeps K rows per window; after each step every beam continues some beam of its window
and must take over that beam's self-attention history. Gathering every row (``index_select`` then
``copy_``) moves the whole cache four times per step (read, write a copy, read it, write back),
though most beams usually continue themselves. Here one program owns one (group, head, span of
positions) of every layer: it loads the sources of the rows that move, waits for all its threads
(``debug_barrier``), then writes those rows. Rows of other groups are other programs' and sources
never cross groups, so no program reads what another writes. A group in which no row moves costs
one load of its origins. Given each row's count of written positions (``lengths``, read on the
device), a program moves only the positions its group's rows have written: a beam search on the
device loop, whose host does not know how far the rows have got, moves no more than one that does.

Only CUDA runs the kernel (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check
``triton_support.kernels_can_run`` and otherwise copy with ``index_select``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .triton_support import HAVE_TRITON, pdl_options, tl, triton

if HAVE_TRITON:
    from .triton_support import pdl_enter

BLOCK = 512  # elements of one row's span per program and tensor
NUM_WARPS = 4

if HAVE_TRITON:

    @triton.jit
    def _reorder_kernel(a_ptr, b_ptr, origin_ptr, lengths_ptr, span, dim, layers, s_layer, s_row, s_head,
                        H: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK: tl.constexpr,
                        TWO: tl.constexpr, BOUNDED: tl.constexpr, PDL: tl.constexpr):
        """Program (group * H + head, block): rows group*GROUP + i take row origin[...] over elements
        [block*BLOCK, (block+1)*BLOCK) of the head's span, in every layer (``BOUNDED``: of the first
        max(lengths[group's rows]) positions only)."""
        if PDL:
            pdl_enter()
        gh = tl.program_id(0)
        blk = tl.program_id(1)
        head = (gh % H).to(tl.int64)
        i = tl.arange(0, GROUP_P2)
        row = (gh // H).to(tl.int64) * GROUP + i
        in_group = i < GROUP
        src = tl.load(origin_ptr + row, mask=in_group, other=0).to(tl.int64)
        moved = in_group & (src != row)
        limit = span
        if BOUNDED:
            written = tl.load(lengths_ptr + row, mask=in_group, other=0).to(tl.int64)
            limit = tl.minimum(tl.max(written, axis=0) * dim, span)
        if (tl.max(moved.to(tl.int32), axis=0) > 0) & (blk * BLOCK < limit):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            mask = moved[:, None] & (offs < limit)[None, :]
            src_at = src[:, None] * s_row + head * s_head + offs[None, :]
            dst_at = row[:, None] * s_row + head * s_head + offs[None, :]
            a_layer = a_ptr
            b_layer = b_ptr
            for _ in range(layers):  # a pointer stepped per layer: no 32-bit layer offset to overflow
                a = tl.load(a_layer + src_at, mask=mask)
                if TWO:
                    b = tl.load(b_layer + src_at, mask=mask)
                tl.debug_barrier()  # every source read before any row of the group is overwritten
                tl.store(a_layer + dst_at, a, mask=mask)
                if TWO:
                    tl.store(b_layer + dst_at, b, mask=mask)
                a_layer += s_layer
                b_layer += s_layer


def reorder_in_groups(tensors: Sequence[torch.Tensor], origin: torch.Tensor, group: int,
                      lengths: Optional[torch.Tensor] = None) -> None:
    """For each of one or two tensors [L, R, H, S, D] (views of a cache: any strides, but each head's
    S x D span contiguous), row r of every layer and head becomes what row ``origin[r]`` held, in
    place. ``origin`` [R] (int64, on the tensors' device) maps each row into its own group of
    ``group`` consecutive rows; graph-safe (nothing read back to the host). ``lengths`` [R] (integers
    on the device): positions 0 .. lengths[r] - 1 of row r hold its history; a group's positions from
    the largest of its rows' lengths on are left as they are."""
    if not 1 <= len(tensors) <= 2:
        raise ValueError("reorder_in_groups: one or two tensors")
    a = tensors[0]
    b = tensors[-1]
    if a.dim() != 5 or b.shape != a.shape or b.stride() != a.stride() or b.dtype != a.dtype:
        raise ValueError("reorder_in_groups: tensors must be [L, R, H, S, D] of one shape, layout and dtype")
    layers, rows, heads, seq, dim = a.shape
    if a.stride(4) != 1 or (seq > 1 and a.stride(3) != dim):
        raise ValueError("reorder_in_groups: each head's S x D span must be contiguous")
    if rows % group or origin.shape != (rows,):
        raise ValueError(f"reorder_in_groups: origin must be [{rows}] over groups of {group}")
    if lengths is not None and lengths.shape != (rows,):
        raise ValueError(f"reorder_in_groups: lengths must be [{rows}]")
    span = seq * dim
    grid = (rows // group * heads, triton.cdiv(span, BLOCK))
    _reorder_kernel[grid](
        a, b, origin, origin if lengths is None else lengths, span, dim, layers, a.stride(0), a.stride(1), a.stride(2),
        H=heads, GROUP=group, GROUP_P2=triton.next_power_of_2(group), BLOCK=BLOCK, TWO=len(tensors) == 2,
        BOUNDED=lengths is not None,
        num_warps=NUM_WARPS, **pdl_options(a.device, rows))
