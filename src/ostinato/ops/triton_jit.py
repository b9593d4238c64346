"""The Triton helpers ostinato's kernels share (imported with Triton, when a kernel module first is:
``ops.triton_support`` hands them out): ``pdl_enter``, ``prefetch_l2``, ``fast_sigmoid`` and
``swiglu_rounded``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import settings

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # a Triton without griddepcontrol: no PDL
    HAVE_GDC = False


@triton.jit
def pdl_enter():
    """First statement of a kernel launched with PDL: wait for the previous kernel, then release
    the next one. (Called only under a PDL constexpr, so never traced where Triton lacks it.)"""
    gdc_wait()
    gdc_launch_dependents()


if settings.triton_interpreter() or torch.version.hip:
    @triton.jit
    def prefetch_l2(ptrs, mask):
        """No prefetch where there is no inline PTX (the CPU interpreter, ROCm): a hint only."""
        pass

    @triton.jit
    def _tanh_half(y):
        """Where there is no inline PTX (the CPU interpreter, ROCm), the stand-in for NVIDIA's
        tanh.approx.f16x2: tanh of a half-precision argument, rounded to half precision."""
        return (1.0 - 2.0 / (1.0 + tl.exp2(y.to(tl.float32) * 2.8853900817779268))).to(tl.float16)
else:
    @triton.jit
    def prefetch_l2(ptrs, mask):
        """Ask L2 for the lines holding ``ptrs`` where ``mask`` (a hint: nothing is loaded into
        registers, nothing waits on it). Before ``pdl_enter``, for data the kernel ahead does not
        write: the fetch then overlaps that kernel."""
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _tanh_half(y):
        """tanh of half-precision values, two per special-function-unit instruction."""
        return tl.inline_asm_elementwise("tanh.approx.f16x2 $0, $1;", "=r,r", [y], dtype=tl.float16,
                                         is_pure=True, pack=2)


@triton.jit
def fast_sigmoid(x):
    """float32 sigmoid(x) = (1 + tanh(x / 2)) / 2 with a half-precision tanh (sm_75 and newer, as
    Triton itself needs): absolute error about 2^-12, for epilogues and element-wise passes that
    store in half precision. One special-function instruction per two values where exp2 and a
    reciprocal took two per value (2 ulp): the feed-forward's first linear with swish in its
    epilogue (52,400 x 1024 -> 4096, float16) went from 728 to 683 us on an H100."""
    return 0.5 + 0.5 * _tanh_half((x * 0.5).to(tl.float16)).to(tl.float32)


@triton.jit
def swiglu_rounded(gate, up):
    """silu(gate) * up of half-precision tiles, each op rounded to their dtype as PyTorch rounds
    ``F.silu(gate) * up`` (silu in float32, rounded; the product in float32, rounded)."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
