"""Host-to-device uploads, and device-to-host downloads, through pinned rings allocated once per device.

A copy from pageable memory waits for all the work queued on the device, so uploads go through
pinned memory. ``Tensor.pin_memory()`` takes it from PyTorch's caching host allocator, which pins
a new block (``cudaHostAlloc``, 0.1 ms for a few bytes to ms for megabytes) whenever no cached block
of the size is free; blocks stay busy until their copy has run, so a first call, whose uploads queue
far ahead of the device, pinned about 200 blocks: 0.09 s of a first random-tiny transcription at
batch 16 (H100, under cProfile) that later calls did not pay. The ring is pinned once (on the load's
helper, ``reserve``); each upload takes the next free span after the last one and marks it busy
with an event until its copy has run. An upload that does not fit beside the spans still in flight
(or is over half the ring) takes the allocator's path instead: never a wait.

Downloads have a ring of their own (``download``): a span is busy until its copy has run and its
receiver has copied it out to ordinary memory (``Download.take``), or dropped it. A first tiny.en
``transcribe_batch`` of 20 audios spent 26 ms of its engine thread pinning a block for each
audio's features to come back in (11 ms for the 377-s recording's 12 MB, H200), later calls 0.5.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Callable, Deque, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

# bytes: half of it (the most one upload takes) holds 8 minutes of samples; at 32 MiB the e2e
# benchmark's 377-s recording went past it and pinned a block of its own in a first call
CAPACITY = 64 << 20
# bytes: half of it holds the log-mel features of 8.7 minutes of audio (80 bins of float32 per 10 ms)
DOWNLOAD_CAPACITY = 32 << 20
ALIGN = 512  # every span starts on a multiple (any dtype's view is aligned)


def copy_on_this_thread(dst: Tensor, src: Tensor) -> None:
    """``dst.copy_(src)`` for host tensors of one shape, as one memory copy on the calling thread.

    PyTorch splits a copy of more than 32K elements over the calling thread's OpenMP team. Uploads
    come from the thread that runs the model, whose team shares the cores with the engine's workers:
    a region waits for its slowest member, and while the workers were busy in a first call (H200, a
    first tiny.en ``transcribe_batch``) the 1-MB copies of 40 log-mel windows once took 91 ms against
    17. A memory copy gains little from more threads; numpy's runs on this one, without the GIL."""
    if src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous() and src.shape == dst.shape:
        np.copyto(dst.reshape(-1).view(torch.uint8).numpy(), src.detach().reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src)


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
    the current stream; ``download(tensor)``: a device tensor's way back through a span. Both None
    when the span does not fit (the caller pins a block otherwise). A ring serves one direction."""

    def __init__(self, device: torch.device, capacity: int = CAPACITY):
        self.device = device
        self._buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
        self._spans = RingSpans(capacity)
        self._lock = threading.Lock()  # uploads and downloads come from the engine's threads

    def _span_for(self, tensor: Tensor, done: Callable[[], bool]) -> Optional[Tensor]:
        """(Under the lock) a span of the ring shaped like ``tensor``, busy until ``done()``; None when
        ``tensor`` is empty, over half the ring, or does not fit beside the spans in flight."""
        size = tensor.numel() * tensor.element_size()
        if size == 0 or size > self._spans.capacity // 2:
            return None
        start = self._spans.claim(-(-size // ALIGN) * ALIGN, done)
        if start is None:
            return None
        return self._buffer[start : start + size].view(tensor.dtype).view(tensor.shape)

    def upload(self, tensor: Tensor) -> Optional[Tensor]:
        with self._lock:
            event = torch.cuda.Event()
            staged = self._span_for(tensor, event.query)
            if staged is None:
                return None
            copy_on_this_thread(staged, tensor)
            out = staged.to(self.device, non_blocking=True)
            event.record(torch.cuda.current_stream(self.device))  # the span is free once the copy ran
        return out

    def download(self, tensor: Tensor) -> Optional["Download"]:
        """A copy of device ``tensor`` on its way into a span of the ring, ordered on the current
        stream; None when it does not fit. The span is busy until the copy has run and the
        ``Download`` was taken (or dropped)."""
        with self._lock:
            event, taken = torch.cuda.Event(), threading.Event()
            # The copy must have run too: a span dropped before its copy landed is not written over.
            staged = self._span_for(tensor, lambda: taken.is_set() and event.query())
            if staged is None:
                return None
            staged.copy_(tensor, non_blocking=True)
            event.record(torch.cuda.current_stream(tensor.device))
        return Download(staged, event, taken)


class Download:
    """A device tensor's copy into a span of the download ring. ``event``: the copy has run once it
    has (query it from the thread that launches device work); ``take()`` (after that, from any thread:
    no CUDA call) returns the values in ordinary memory and gives the span back."""

    def __init__(self, staged: Tensor, event, taken: threading.Event):
        self.event = event
        self._staged, self._taken = staged, taken
        self._host: Optional[Tensor] = None
        weakref.finalize(self, taken.set)  # dropped untaken: the span is free once the copy ran

    def take(self) -> Tensor:
        if self._host is None:
            self._host = torch.empty(self._staged.shape, dtype=self._staged.dtype)
            self._host.copy_(self._staged)
            self._staged = None
            self._taken.set()
        return self._host


_rings: Dict[Tuple[torch.device, str], PinnedRing] = {}
_rings_lock = threading.Lock()


def reserve(device: torch.device, kind: str = "upload") -> PinnedRing:
    """The device's ring for uploads or downloads, pinned on first use (a model's load asks for both
    on its helper thread)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    with _rings_lock:
        ring = _rings.get((device, kind))
        if ring is None:
            ring = _rings[(device, kind)] = PinnedRing(device, DOWNLOAD_CAPACITY if kind == "download" else CAPACITY)
        return ring


def upload(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` (on the host) on CUDA ``device`` without waiting for the device's queued work."""
    out = reserve(device).upload(tensor)
    return out if out is not None else tensor.pin_memory().to(device, non_blocking=True)


def download(tensor: Tensor) -> Optional[Download]:
    """CUDA ``tensor``'s copy on its way to the host through the download ring, or None when it does
    not fit there (the caller pins a block of its own)."""
    return reserve(tensor.device, "download").download(tensor)
