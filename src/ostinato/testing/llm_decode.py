"""A language model's decode step on its fused kernels beside the same step on PyTorch's ops: what
dev/llm_fused_check.py and the GPU tests compare."""
from __future__ import annotations

import contextlib

import torch

from ..ops import decode_attention, gated_delta_decode, moe_decode, rotary_cache, skinny
from ..runtime import DeviceState


@contextlib.contextmanager
def unfused_decode():
    """Inside this block a decode step runs PyTorch's ops, not ostinato's decode kernels: the skinny
    products, the q/k rotary-and-cache kernel, the grouped-query attention, the MoE block's kernels
    and the Gated DeltaNet step's."""
    modules = (skinny, decode_attention, rotary_cache, moe_decode, gated_delta_decode)
    names = ("op_can_run", "gqa_can_run", "can_run", "can_run", "can_run")
    saved = [getattr(module, name) for module, name in zip(modules, names)]
    for module, name in zip(modules, names):
        setattr(module, name, lambda *args: False)
    try:
        yield
    finally:
        for module, name, check in zip(modules, names, saved):
            setattr(module, name, check)


def step_logits(net, device: torch.device, rows: int = 3, steps: int = 4) -> torch.Tensor:
    """float64 logits [steps, rows, V] of ``steps`` decode steps of ``rows`` rows from an empty cache,
    fed fixed tokens (so that one path's near-tie does not change the other steps' inputs)."""
    state = DeviceState(device)
    for key, (shape, dtype) in net.state_spec(rows, 64).items():
        state.allocate(key, shape, dtype)
    g = torch.Generator().manual_seed(7)
    out = []
    for step in range(steps):
        tokens = torch.randint(3, 320, (rows,), generator=g).to(device)
        out.append(net.decode(tokens, torch.arange(rows, device=device) + step, state, rows))
    return torch.stack(out).double()
