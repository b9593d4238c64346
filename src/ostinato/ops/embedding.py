"""A decode step's input rows: token embedding + position embedding, and each row's key count, in one launch.

PyTorch takes four launches for what a Whisper step starts with (the token's row, the position's row,
their sum, ``positions + 1``), each a few microseconds of a chain of latency-bound kernels; here one
program a row gathers both embedding rows, adds them in float32 and rounds once (the bits of
PyTorch's half-precision ``a + b``), and writes the row's key count beside it.

Only CUDA runs the kernel (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check
``triton_support.kernels_can_run`` and otherwise use PyTorch.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .triton_support import HAVE_TRITON, pdl_options, tl, triton

if HAVE_TRITON:
    from .triton_support import pdl_enter

    @triton.jit
    def _embed_kernel(tok_ptr, pos_ptr, tw_ptr, pw_ptr, x_ptr, len_ptr, D, stw, spw, sx,
                      BLOCK: tl.constexpr, PDL: tl.constexpr):
        """Row r: x[r] = token_weight[tokens[r]] + position_weight[positions[r]], lengths[r] = positions[r] + 1."""
        if PDL:  # the tokens are the kernel ahead's output
            pdl_enter()
        row = tl.program_id(0).to(tl.int64)
        token = tl.load(tok_ptr + row).to(tl.int64)
        position = tl.load(pos_ptr + row)
        cols = tl.arange(0, BLOCK)
        ok = cols < D
        a = tl.load(tw_ptr + token * stw + cols, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(pw_ptr + position.to(tl.int64) * spw + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * sx + cols, (a + b).to(x_ptr.dtype.element_ty), mask=ok)
        tl.store(len_ptr + row, position + 1)


def embed_rows(tokens: torch.Tensor, positions: torch.Tensor, token_weight: torch.Tensor,
               position_weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x [N, D], lengths [N]) for N rows: ``token_weight[tokens] + position_weight[positions]`` in
    the weights' dtype, and ``positions + 1`` in the positions' dtype. tokens and positions: integer
    tensors of N elements (any shape); the weights [rows, D] with contiguous rows, of one dtype."""
    tokens, positions = tokens.reshape(-1), positions.reshape(-1)
    n = tokens.numel()
    d = token_weight.shape[-1]
    if positions.numel() != n or tokens.is_floating_point() or positions.is_floating_point():
        raise ValueError(f"embed_rows: tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} "
                         "must be integer tensors of one size")
    if (token_weight.dim() != 2 or position_weight.dim() != 2 or position_weight.shape[1] != d
            or token_weight.dtype != position_weight.dtype or token_weight.stride(-1) != 1
            or position_weight.stride(-1) != 1):
        raise ValueError(f"embed_rows: weights {tuple(token_weight.shape)} {token_weight.dtype} and "
                         f"{tuple(position_weight.shape)} {position_weight.dtype} must be [rows, {d}] of one "
                         "dtype with contiguous rows")
    x = torch.empty(n, d, device=token_weight.device, dtype=token_weight.dtype)
    lengths = torch.empty_like(positions)
    if n:
        _embed_kernel[(n,)](tokens, positions, token_weight, position_weight, x, lengths, d,
                            token_weight.stride(0), position_weight.stride(0), x.stride(0),
                            BLOCK=triton.next_power_of_2(d), num_warps=1 if d <= 512 else 4,
                            **pdl_options(x.device, n))
    return x, lengths
