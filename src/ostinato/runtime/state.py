"""Named persistent device buffers: allocated once, fixed addresses, written in place."""
from __future__ import annotations

from typing import Dict, Iterator, Sequence, Tuple

import torch


class DeviceState:
    """Owns the buffers a decode loop needs across steps and calls.

    A buffer is allocated once with a fixed shape, dtype and address; step code writes it in place
    (``copy_``, ``index_copy_``, ``out=``). Captured graphs hold raw addresses, so reallocating a
    buffer after capture would silently break them: asking again for a name with another spec raises.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._buffers: Dict[str, torch.Tensor] = {}

    def allocate(self, name: str, shape: Tuple[int, ...], dtype: torch.dtype, fill: float | int = 0) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        existing = self._buffers.get(name)
        if existing is not None:
            if tuple(existing.shape) != shape or existing.dtype != dtype:
                raise ValueError(
                    f"state buffer {name!r} already exists as {tuple(existing.shape)} {existing.dtype}; "
                    f"cannot reallocate it as {shape} {dtype}"
                )
            return existing
        buffer = torch.full(shape, fill, dtype=dtype, device=self.device)
        self._buffers[name] = buffer
        return buffer

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._buffers[name]
        except KeyError:
            raise KeyError(f"no state buffer named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def write(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """Copy ``value`` into the leading rows of buffer ``name`` (its address never changes)."""
        buffer = self[name]
        if value.dim() != buffer.dim() or any(v > b for v, b in zip(value.shape, buffer.shape)):
            raise ValueError(f"cannot write shape {tuple(value.shape)} into state buffer {name!r} of shape {tuple(buffer.shape)}")
        target = buffer[tuple(slice(0, n) for n in value.shape)]
        target.copy_(value)
        return target

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def addresses(self) -> Dict[str, int]:
        return {name: b.data_ptr() for name, b in self._buffers.items()}


def concat_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` along dim 0, as a view without a copy when the parts are consecutive
    slices of one tensor (the rows of a batch handed out one request at a time and admitted together)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    step = first.shape[0] * first.stride(0) if first.dim() else 0
    storage = first.untyped_storage().data_ptr()
    consecutive = step > 0 and all(
        p.shape == first.shape and p.stride() == first.stride() and p.dtype == first.dtype
        and p.device == first.device and p.untyped_storage().data_ptr() == storage
        and p.storage_offset() == first.storage_offset() + i * step
        for i, p in enumerate(parts)
    )
    if not consecutive:
        return torch.cat(list(parts))
    shape = (first.shape[0] * len(parts),) + tuple(first.shape[1:])
    return first.as_strided(shape, first.stride(), first.storage_offset())
