"""How long a run's advances keep the device busy: what host work can hide behind the one in flight.

A run launches an advance (a replay, or a device loop that runs until a row finishes) and comes back
for its results later; host work done meanwhile (a graph capture put off to spare time) is free only
while the device is still busy. The clock times each advance on the device (two timing events, no
wait) and estimates, for the one in flight, the device time left: the last measured advance's length
less the host time since this one was launched. On the CPU there are no events and nothing is left.
"""
from __future__ import annotations

import time
from typing import Optional

import torch


class AdvanceClock:
    def __init__(self, device: torch.device):
        self._on_cuda = torch.device(device).type == "cuda"
        self._start = self._end = None
        self._launched_at: Optional[float] = None
        self.last_seconds: Optional[float] = None  # the device time of the last advance measured

    def launching(self, measure: bool = True) -> None:
        """Just before an advance's launch. ``measure=False``: the launch may do host work of its own
        first (a capture), which the device would count as busy time, so this one is not timed."""
        self._launched_at = time.perf_counter()
        self._start = self._end = None
        if self._on_cuda and measure:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()

    def launched(self) -> None:
        """Just after the launch (the device has the whole advance queued)."""
        if self._start is not None:
            self._end = torch.cuda.Event(enable_timing=True)
            self._end.record()

    def collected(self) -> None:
        """After the host read the advance's results: its device time, if it was timed."""
        if self._end is not None and self._end.query():
            self.last_seconds = self._start.elapsed_time(self._end) / 1000.0
        self._start = self._end = self._launched_at = None

    def seconds_left(self) -> float:
        """The device time the advance in flight likely has left (0 without one, or before any was timed)."""
        if self._launched_at is None or self.last_seconds is None:
            return 0.0
        return max(0.0, self.last_seconds - (time.perf_counter() - self._launched_at))
