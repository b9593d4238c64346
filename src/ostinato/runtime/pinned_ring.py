"""Host-to-device uploads through one pinned ring per device, allocated once.

A copy from pageable memory waits for all the work queued on the device, so uploads go through
pinned memory. ``Tensor.pin_memory()`` takes it from PyTorch's caching host allocator, which pins
a new block (``cudaHostAlloc``, 0.1 ms for a few bytes to ms for megabytes) whenever no cached block
of the size is free; blocks stay busy until their copy has run, so a first call, whose uploads queue
far ahead of the device, pinned about 200 blocks: 0.09 s of a first random-tiny transcription at
batch 16 (H100, under cProfile) that later calls did not pay. The ring is pinned once (on the load's
helper, ``reserve``); each upload takes the next free span after the last one and marks it busy
with an event until its copy has run. An upload that does not fit beside the spans still in flight
(or is over half the ring) takes the allocator's path instead: never a wait.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Deque, Dict, Optional, Tuple

import torch
from torch import Tensor

# bytes: half of it (the most one upload takes) holds 8 minutes of samples; at 32 MiB the e2e
# benchmark's 377-s recording went past it and pinned a block of its own in a first call
CAPACITY = 64 << 20
ALIGN = 512  # every span starts on a multiple (any dtype's view is aligned)


class RingSpans:
    """The bookkeeping of a ring of ``capacity`` bytes: spans handed out in order, each busy until its
    ``done()`` says so. Spans are retired oldest first (uploads on one stream complete in order; one
    finished early is retired with those before it)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._head = 0
        self._busy: Deque[Tuple[int, int, Callable[[], bool]]] = deque()  # (start, end, done), oldest first

    def claim(self, size: int, done: Callable[[], bool]) -> Optional[int]:
        """The start of ``size`` free bytes, now busy until ``done()``; None when they do not fit."""
        if size <= 0 or size > self.capacity:
            return None
        while self._busy and self._busy[0][2]():
            self._busy.popleft()
        if not self._busy:
            self._head = 0  # all free: start over, the largest span fits
        start = self._head if self._head + size <= self.capacity else 0
        if any(start < end and begin < start + size for begin, end, _ in self._busy):
            return None
        self._busy.append((start, start + size, done))
        self._head = start + size
        return start

    @property
    def busy(self) -> int:
        return len(self._busy)


class PinnedRing:
    """``upload(tensor)``: ``tensor`` on the ring's device through a span of the pinned ring, ordered on
    the current stream; None when it does not fit (the caller pins it otherwise)."""

    def __init__(self, device: torch.device, capacity: int = CAPACITY):
        self.device = device
        self._buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
        self._spans = RingSpans(capacity)
        self._lock = threading.Lock()  # uploads come from the engine's threads

    def upload(self, tensor: Tensor) -> Optional[Tensor]:
        size = tensor.numel() * tensor.element_size()
        if size == 0 or size > self._spans.capacity // 2:
            return None
        tensor = tensor.contiguous()
        with self._lock:
            event = torch.cuda.Event()
            start = self._spans.claim(-(-size // ALIGN) * ALIGN, event.query)
            if start is None:
                return None
            staged = self._buffer[start : start + size].view(tensor.dtype).view(tensor.shape)
            staged.copy_(tensor)
            out = staged.to(self.device, non_blocking=True)
            event.record(torch.cuda.current_stream(self.device))  # the span is free once the copy ran
        return out


_rings: Dict[torch.device, PinnedRing] = {}
_rings_lock = threading.Lock()


def reserve(device: torch.device) -> PinnedRing:
    """The device's ring, pinned on first use (a model's load asks for it on its helper thread)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    with _rings_lock:
        ring = _rings.get(device)
        if ring is None:
            ring = _rings[device] = PinnedRing(device)
        return ring


def upload(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` (on the host) on CUDA ``device`` without waiting for the device's queued work."""
    out = reserve(device).upload(tensor)
    return out if out is not None else tensor.pin_memory().to(device, non_blocking=True)
