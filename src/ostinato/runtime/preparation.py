"""A model's load, and beside it on a helper thread, the once-per-process work of its first call.

A first transcription in a fresh process paid, before any of its own work: Triton's preparation
(see ``ops.triton_support.prepare``) and the first use of each CUDA library PyTorch loads lazily,
measured on an H200 in processes of their own: cuBLAS 86-112 ms at its first half-precision product
and 83-119 ms more at its first float32 one, cuDNN 79-124 ms at its first convolution, cuFFT up
to 73 ms (cold disk cache), PyTorch's embedding kernel 57-72 ms. ``prepared_in_background`` does
all of it while the block (the checkpoint's read and upload) runs; the block's exit waits for it,
so nothing else touches Triton or captures a graph meanwhile.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

import torch
import torch.nn.functional as F

from ..ops import triton_support

log = logging.getLogger(__name__)

PREPARE_WAIT_S = 60.0  # the longest a model's load waits for the helper (normally under 1 s)


@contextlib.contextmanager
def prepared_in_background(device) -> Iterator[None]:
    """Run the block while a helper thread prepares Triton and loads CUDA's libraries (CUDA only).

    Best effort: what fails on the helper happens at the first call, as it would have. A helper
    still running after ``PREPARE_WAIT_S`` (a hung ptxas, say) is left behind with a warning.
    """
    device = torch.device(device)
    thread = None
    if device.type == "cuda":
        thread = threading.Thread(target=_prepare, args=(device,), name="ostinato-prepare", daemon=True)
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join(PREPARE_WAIT_S)
            if thread.is_alive():
                log.warning("the first-call preparation is still running after %.0f s; not waiting for it",
                            PREPARE_WAIT_S)


def _prepare(device: torch.device) -> None:
    triton_support.prepare(device)
    try:
        load_cuda_libraries(device)
    except Exception as exc:  # noqa: BLE001 - only an early start; the first call does it otherwise
        log.debug("loading CUDA's libraries in the background failed: %s", exc)


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
