"""The small pointwise and reduction chains of the LLM layers (RMSNorm, rotary, the SwiGLU gate,
Gated DeltaNet's gates), each compiled into one kernel for prefill on CUDA.

Eager PyTorch runs every op of a chain as its own kernel over the whole [tokens, hidden] activation:
a float32 RMSNorm is six passes over it, the rotary embedding seven. In a 4096-token Qwen3-8B
prefill these passes took about 40% of the GPU time (H100), the matmuls and attention the rest.
``torch.compile(dynamic=True)`` turns each chain into one kernel that serves every prompt length
and every layer (the weights are arguments, not captured constants), compiled once per process.

The decoder turns this on around its prefill (``enabled``) when it compiles its decode step; the
decode step is compiled as a whole, so inside it these functions are plain code that dynamo
inlines. Anything else (CPU, compile off, a chain that fails to compile) runs the eager ops, which
define the numbers: compiled kernels differ from them by float rounding only.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops import swiglu as swiglu_kernel

log = logging.getLogger(__name__)
_ENABLED = contextvars.ContextVar("ostinato_llm_fusion", default=False)


@contextlib.contextmanager
def enabled(on: bool = True):
    """Run the chains compiled (CUDA tensors only) inside this block."""
    token = _ENABLED.set(on)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _compilable(x: Tensor) -> bool:
    return x.is_cuda


def fusible(fn):
    """``fn`` compiled with dynamic shapes where enabled and on CUDA, eager elsewhere; a chain that
    fails to compile is logged once and stays eager (it is pure, so nothing ran half-way)."""
    compiled = None

    @functools.wraps(fn)
    def run(x: Tensor, *args, **kwargs):
        nonlocal compiled
        # first: inside a compiled caller (the decode step) this is plain code to inline, and dynamo
        # would break its graph at the context variable
        if torch.compiler.is_compiling() or not _ENABLED.get() or not _compilable(x):
            return fn(x, *args, **kwargs)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True)
        if compiled is fn:
            return fn(x, *args, **kwargs)
        try:
            return compiled(x, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an inductor failure costs speed, not the call
            log.warning("ostinato: %s runs uncompiled (%s: %s)", fn.__name__, type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            compiled = fn
            return fn(x, *args, **kwargs)

    run.uncompiled = fn
    return run


@fusible
def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centered: bool) -> Tensor:
    """Llama/Qwen3 scale the normalised input cast back to its dtype; Qwen3-Next and Qwen3.5 store the
    weight as an offset from one and scale in float32 before the cast."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


@fusible
def add_rms_norm(x: Tensor, update: Tensor, weight: Tensor, eps: float, zero_centered: bool):
    """(x + update, rms_norm of it): the residual add and the next norm in one pass."""
    x = x + update
    return x, rms_norm.uncompiled(x, weight, eps, zero_centered)


@fusible
def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Gated DeltaNet's output norm: RMSNorm per value head, then times silu(z)."""
    return (rms_norm.uncompiled(x, weight, eps, False) * F.silu(z.float())).to(x.dtype)


@fusible
def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding on the first ``2 * cos.shape[-1]`` features of each head (the rest pass)."""
    dim = cos.shape[-1] * 2
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    turned = torch.cat((-rot[..., half:], rot[..., :half]), -1)
    out = rot * cos2 + turned * sin2
    return torch.cat((out, rest), -1) if rest.shape[-1] else out


@fusible
def _swiglu_chain(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up, gate_up holding the gate's columns first: one Triton pass where it runs outside
    a compiled caller (``ops.swiglu``: a prefill's 4096 x 12288 product at 1.6 TB/s compiled), else
    the chain (compiled where enabled, inlined into a compiled decode step)."""
    if not torch.compiler.is_compiling() and swiglu_kernel.can_run(gate_up):
        return swiglu_kernel.swiglu(gate_up)
    return _swiglu_chain(gate_up)


swiglu.uncompiled = _swiglu_chain.uncompiled


@fusible
def delta_gates(b: Tensor, a: Tensor, a_log: Tensor, dt_bias: Tensor):
    """Gated DeltaNet's write strength beta = sigmoid(b) and log decay g = -exp(A_log) softplus(a + dt_bias)."""
    return b.sigmoid(), -a_log.float().exp() * F.softplus(a.float() + dt_bias)
