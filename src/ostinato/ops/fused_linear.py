"""Linears whose activation is their product's epilogue: persistent tensor-memory-accelerator GEMMs
(Hopper and newer).

* ``linear_silu(x, w, b)`` = silu(x @ w.T + b): a feed-forward's first linear. With cuBLAS the
  product writes [rows, 4 * d] and the swish reads it back. On an H100 at 29,250 x 1024 -> 4096
  (float16): 402 us against cuBLAS's 377 us product plus its 121 us swish.
* ``linear_glu(x, w, b)`` = glu(x @ w.T + b): the conformer convolution module's first pointwise
  convolution. Each program takes the value and gate columns of the same channels (two products
  per tile), so only the [rows, C] result is written, not [rows, 2C] (29,250 x 1024 -> 2048:
  254 us against 286 us for cuBLAS and the GLU).

Rows are independent: a row's result does not depend on the others. Where the kernels cannot run
(no Triton, no TMA, a CPU, float32, unaligned rows) the plain PyTorch ops run.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .triton_support import HAVE_TRITON, kernels_can_run, tl, triton

if HAVE_TRITON:  # pragma: no cover - depends on the installation
    from .triton_support import fast_sigmoid

if HAVE_TRITON:  # pragma: no cover - depends on the installation
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # a Triton without host-side tensor descriptors
        TensorDescriptor = None

    @triton.jit
    def _tile_origin(tile, num_m, num_n, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        """Output tiles GROUP_M row tiles at a time, so that the weight's column tiles stay in L2."""
        group = tile // (GROUP_M * num_n)
        first_m = group * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return (first_m + tile % size_m) * BM, ((tile % (GROUP_M * num_n)) // size_m) * BN

    @triton.jit
    def _linear_act_kernel(a_desc, w_desc, c_desc, bias_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                           BK: tl.constexpr, GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, GLU: tl.constexpr):
        """Output columns [on, on + BN) of silu(a @ w.T + b), or with GLU of glu(a @ w.T + b) (N = C
        channels: values from weight rows on.., gates from rows C + on..)."""
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        for tile in tl.range(tl.program_id(0), num_m * num_n, PROGRAMS, flatten=True):  # persistent
            om, on = _tile_origin(tile, num_m, num_n, BM, BN, GROUP_M)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            if GLU:
                gate = tl.zeros((BM, BN), dtype=tl.float32)
            for ki in range(tl.cdiv(K, BK)):
                a = a_desc.load([om, ki * BK])
                acc = tl.dot(a, w_desc.load([on, ki * BK]).T, acc)
                if GLU:
                    gate = tl.dot(a, w_desc.load([N + on, ki * BK]).T, gate)
            cols = on + tl.arange(0, BN)
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
            if GLU:
                gate += tl.load(bias_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
                out = acc * fast_sigmoid(gate)
            else:
                out = acc * fast_sigmoid(acc)
            c_desc.store([om, on], out.to(c_desc.dtype))

CONFIG = {
    "silu": dict(BM=128, BN=256, BK=64, GROUP_M=16, num_warps=8, num_stages=3),
    "glu": dict(BM=128, BN=128, BK=64, GROUP_M=16, num_warps=8, num_stages=4),
}


@functools.lru_cache(maxsize=None)
def _has_tma(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def fused_linear_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernels' conditions: CUDA with TMA (sm90+), Triton with tensor descriptors, half precision,
    2-D contiguous operands with 16-byte aligned rows."""
    if not (kernels_can_run(x, x.dtype) and TensorDescriptor is not None and _has_tma(x.device.index or 0)):
        return False
    return (x.dim() == 2 and x.is_contiguous() and weight.is_contiguous() and weight.dtype == x.dtype
            and x.shape[1] % 8 == 0 and weight.shape[0] % 16 == 0)


def _launch(glu, x, weight, bias, n):
    m, k = x.shape
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    cfg = CONFIG["glu" if glu else "silu"]
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    programs = min(torch.cuda.get_device_properties(x.device).multi_processor_count,
                   triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _linear_act_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), bias, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"],
        PROGRAMS=programs, GLU=glu, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out


def linear_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(x @ weight.T + bias): x [M, K], weight [N, K], bias [N] -> [M, N]."""
    if not fused_linear_supported(x, weight):
        return F.silu(F.linear(x, weight, bias), inplace=True)
    return _launch(False, x, weight, bias, weight.shape[0])


def linear_glu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """glu(x @ weight.T + bias) (values the first half of the outputs, gates the second): x [M, K],
    weight [2C, K], bias [2C] -> [M, C]."""
    if not fused_linear_supported(x, weight):
        return F.glu(F.linear(x, weight, bias), dim=-1)
    return _launch(True, x, weight, bias, weight.shape[0] // 2)

