"""One copy of every weight per device, and a report of what the device holds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional

import torch
from torch import nn


def place_module(module: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move a module's parameters and floating buffers to ``device``/``dtype`` once, for inference.

    Every method and captured graph then calls this same module, so they share the parameter
    tensors by object identity; nothing is copied per method or per batch bucket.
    """
    module.to(device=device, dtype=dtype)
    module.eval()
    module.requires_grad_(False)
    return module


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights count once)."""
    seen: Dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def duplicated_parameters(module: nn.Module) -> Dict[str, str]:
    """Parameters whose values equal another parameter's but live in a separate storage.

    A second copy of a weight is a bug (it doubles memory traffic); this finds copies among the
    module's own parameters, e.g. an untied output projection that should be the embedding.
    """
    by_shape: Dict[tuple, list] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_shape.setdefault((tuple(p.shape), p.dtype), []).append((name, p))
    duplicates: Dict[str, str] = {}
    for group in by_shape.values():
        for i, (name_a, a) in enumerate(group):
            for name_b, b in group[i + 1:]:
                if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() and a.numel() > 1 and torch.equal(a, b):
                    duplicates[name_b] = name_a
    return duplicates


@dataclass
class MemoryReport:
    device: str
    parameter_bytes: int
    state_bytes: int
    peak_bytes: Optional[int]  # peak allocated on CUDA since the last reset; None on the CPU

    def __str__(self) -> str:
        mib = 1 << 20
        peak = f"{self.peak_bytes / mib:.1f} MiB" if self.peak_bytes is not None else "n/a"
        return (
            f"{self.device}: parameters {self.parameter_bytes / mib:.1f} MiB, "
            f"state {self.state_bytes / mib:.1f} MiB, peak {peak}"
        )


def memory_report(module: nn.Module, state_bytes: int, device: torch.device) -> MemoryReport:
    params = storage_bytes(list(module.parameters()) + [b for b in module.buffers()])
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return MemoryReport(str(device), params, state_bytes, peak)
