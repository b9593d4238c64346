"""SwiGLU of a gate/up product, silu(gate) * up, as one pass over it (a prefill's MLP and experts).

The product [rows, 2I] holds each row's gate columns, then its up columns. In a 4096-token Qwen3.5-2B
prefill on an H100 the compiled chain (``models.llm.fusion.swiglu``) moved its 151 MB at 1.6 TB/s
(96 us a layer, 2.3 ms of a 36-ms prefill), and the experts' grouped products of the MoE prefill
ran it as three eager kernels (silu, mul, then a copy to contiguous rows). Here one program per
(row, block of columns) reads the two halves and writes the result, each op rounded to the dtype as
PyTorch rounds it (silu in float32, rounded; the product in float32, rounded): 50 us a layer
(1.2 ms of that 2B prefill).

Only CUDA runs it (``TRITON_INTERPRET=1`` runs it on the CPU for tests); callers check ``can_run``
and otherwise use PyTorch's ops.
"""
from __future__ import annotations

import torch

from .triton_support import HAVE_TRITON, kernels_can_run, tl, triton

BLOCK = 1024  # output columns a program: 8 per thread over 4 warps, 16-byte loads
WARPS = 4

if HAVE_TRITON:
    from .triton_support import swiglu_rounded

    @triton.jit
    def _swiglu_kernel(x_ptr, out_ptr, inner, sx, so, BLOCK: tl.constexpr):
        """out[r, c] = silu(x[r, c]) * x[r, inner + c], each op rounded to the dtype."""
        r = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < inner
        gate = tl.load(x_ptr + r * sx + cols, mask=ok, other=0.0)
        up = tl.load(x_ptr + r * sx + inner + cols, mask=ok, other=0.0)
        tl.store(out_ptr + r * so + cols, swiglu_rounded(gate, up), mask=ok)


def can_run(gate_up: torch.Tensor) -> bool:
    """The kernel serves this: Triton on its device, a half dtype, an even last dimension whose
    elements are contiguous, rows that flatten to one stride."""
    if not kernels_can_run(gate_up, gate_up.dtype, interpreter=True) or gate_up.dim() < 2:
        return False
    if gate_up.shape[-1] % 2 or gate_up.stride(-1) != 1:
        return False
    try:
        gate_up.view(-1, gate_up.shape[-1])
    except RuntimeError:
        return False
    return True


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I] (gate columns first): contiguous [..., I]."""
    inner = gate_up.shape[-1] // 2
    rows = gate_up.view(-1, gate_up.shape[-1])
    out = torch.empty(*gate_up.shape[:-1], inner, device=gate_up.device, dtype=gate_up.dtype)
    if rows.shape[0] and inner:
        flat = out.view(-1, inner)
        _swiglu_kernel[(rows.shape[0], triton.cdiv(inner, BLOCK))](
            rows, flat, inner, rows.stride(0), flat.stride(0), BLOCK=BLOCK, num_warps=WARPS)
    return out
