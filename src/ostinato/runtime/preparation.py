"""A model's load, and beside it on helper threads, the once-per-process work of its first call.

A first transcription in a fresh process paid, before any of its own work: Triton's preparation
(see ``ops.triton_support.prepare``) and the first use of each CUDA library PyTorch loads lazily,
measured on an H200 in processes of their own: cuBLAS 86-112 ms at its first half-precision product
and 83-119 ms more at its first float32 one, cuDNN 79-124 ms at its first convolution, cuFFT up
to 73 ms (cold disk cache), PyTorch's embedding kernel 57-72 ms. ``prepared_in_background`` does
all of it while the block (the checkpoint's read and upload) runs; the block's exit waits for it,
so nothing else touches Triton or captures a graph meanwhile. A model adds its own first uses once
it knows its shapes (``Helper.also``): a first tiny.en transcription on an H100 still spent ~0.2 s
loading PyTorch's kernels for its features and encoder (each kernel family's first launch, 5-45 ms).

Three threads, each its own piece: Triton's preparation (its import, the model's kernel modules and
their keys; hashing Triton's installation, file reads and hashlib that let go of the GIL, on a
fourth beside them; then what the model queues with ``with_triton``, e.g. the kernels its earlier
processes launched, ``ops.kernel_manifest``), CUDA's libraries, and the model's work as it is
queued. On one thread the helper outlasted tiny.en's load (H100: helper 1.2-1.4 s, weights on the
device at 0.8 s), and each piece of model work added its own time to the load: +0.2-0.4 s for the
features' and encoder's. Apart, the load took 1.07-1.17 s with them and 1.10-1.17 s without, and the first
transcription of a random tiny 0.2 s less (dev/load_ab.py, three rounds).
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..ops import triton_support
from . import device_loop, pinned_ring
from .device import openmp_runtime

log = logging.getLogger(__name__)

PREPARE_WAIT_S = 60.0  # the longest a model's load waits for the helpers (normally under 1 s)


class Helper:
    """The helper threads; ``also(work)`` queues ``work(device)`` on one of its own, and
    ``with_triton(work)`` on the Triton thread once Triton is prepared (work that touches Triton's
    kernels, which nothing else may while it prepares them); both no-ops where there are no helpers.
    Best effort: a failure is logged at debug level, as the first call would have paid the same once
    more."""

    def __init__(self, device: torch.device, start: bool, kernel_modules: Sequence[str] = ()):
        self.device = device
        self.kernel_modules = tuple(kernel_modules)
        self._work: "queue.Queue[Optional[Callable]]" = queue.Queue()
        self._triton_work: "queue.Queue[Optional[Callable]]" = queue.Queue()
        self.threads: List[threading.Thread] = []
        if start:
            self.threads = [threading.Thread(target=target, name=name, daemon=True) for target, name in (
                (self._prepare_triton, "ostinato-prepare-triton"), (self._load_libraries, "ostinato-prepare"),
                (self._run, "ostinato-first-uses"))]
            for thread in self.threads:
                thread.start()

    def also(self, work: Callable[[torch.device], None]) -> None:
        if self.threads:
            self._work.put(work)

    def with_triton(self, work: Callable[[torch.device], None]) -> None:
        if self.threads:
            self._triton_work.put(work)

    def _prepare_triton(self) -> None:
        triton_support.prepare(self.device, self.kernel_modules)
        self._drain(self._triton_work, "Triton")

    def _drain(self, work_queue: "queue.Queue[Optional[Callable]]", label: str) -> None:
        while True:
            work = work_queue.get()
            if work is None:
                return
            try:
                with torch.cuda.device(self.device), torch.inference_mode():
                    work(self.device)
                    torch.cuda.synchronize(self.device)
            except Exception as exc:  # noqa: BLE001 - only an early start; the first call does it otherwise
                log.debug("%s work %r in the background failed: %s", label, work, exc)

    def _load_libraries(self) -> None:
        try:
            load_cuda_libraries(self.device)
            pinned_ring.reserve(self.device)  # pinned once here, not block by block in the first call
            openmp_runtime()  # found here, not by the first call's workers (see one_cpu_thread_here)
            if device_loop.unavailable_reason(self.device.type) is None:
                device_loop.compile_gate(self.device)  # NVRTC, 15-20 ms of the first capture of a loop
        except Exception as exc:  # noqa: BLE001 - only an early start; the first call does it otherwise
            log.debug("loading CUDA's libraries in the background failed: %s", exc)

    def _run(self) -> None:
        self._drain(self._work, "first-call")

    def finish(self) -> None:
        if not self.threads:
            return
        self._work.put(None)
        self._triton_work.put(None)
        deadline = time.monotonic() + PREPARE_WAIT_S
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self.threads):
            log.warning("the first-call preparation is still running after %.0f s; not waiting for it",
                        PREPARE_WAIT_S)


@contextlib.contextmanager
def prepared_in_background(device, kernel_modules: Sequence[str] = ()) -> Iterator[Helper]:
    """Run the block while helper threads prepare Triton and load CUDA's libraries (CUDA only), then
    whatever the block queued with ``helper.also``. ``kernel_modules``: the model's modules of Triton
    kernels that its own modules import lazily; the Triton helper imports them (and Triton with them,
    0.3-0.7 s that ``import ostinato`` no longer pays) and prepares their kernels.

    Best effort: what fails on a helper happens at the first call, as it would have. A helper still
    running after ``PREPARE_WAIT_S`` (a hung ptxas, say) is left behind with a warning.
    """
    device = torch.device(device)
    helper = Helper(device, start=device.type == "cuda", kernel_modules=kernel_modules)
    try:
        yield helper
    finally:
        helper.finish()


@torch.inference_mode()
def load_cuda_libraries(device: torch.device) -> None:
    """Make the libraries and kernels every model's first call uses loaded: a half-precision and a
    float32 product (cuBLAS), a convolution (cuDNN), a float64 FFT (cuFFT), an embedding lookup.
    Tiny shapes: what is paid once is the loading, not the work."""
    with torch.cuda.device(device):
        tokens = torch.zeros(1, 4, dtype=torch.long, device=device)
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            x = torch.ones(8, 64, device=device, dtype=dtype)
            F.linear(x, x)
            F.conv1d(x[None, :, :16], x[:8, :8, None].expand(8, 8, 3).contiguous(), padding=1)
            F.embedding(tokens, x)
        torch.fft.rfft(torch.ones(2, 400, device=device, dtype=torch.float64))
        torch.cuda.synchronize(device)
