"""What every Triton operator asks first: is Triton here, may it run on this device, how many SMs.

Triton is optional (the CPU build and CI have none): importing this module never fails and never
imports Triton; ``HAVE_TRITON`` (looked up: Triton is imported then) says whether ``triton``/``tl``
are real, and ``kernels_can_run`` is the one check every caller makes before it launches a kernel.
``OSTINATO_NO_TRITON=1`` switches every kernel off (the plain PyTorch paths run instead), e.g. to
compare the two on one machine.

Programmatic dependent launch (PDL, Hopper and newer): a kernel launched with ``pdl_options``
may be scheduled while the kernel before it on the stream is still running; its first act,
``pdl_enter``, waits until that kernel has finished and its writes are visible, then lets the next
kernel be scheduled in turn. What overlaps is launch and scheduling, never memory traffic, so the
results are those of plain stream order. ``OSTINATO_NO_PDL=1`` switches it off.

``prepare(device)`` does Triton's once-per-process work before a first launch (``runtime.preparation``
runs it beside a model's load).
"""
from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
import time
from typing import Optional, Sequence

import torch

from .. import settings

log = logging.getLogger(__name__)

# Triton is imported when first asked for (``have_triton``, or this module's attributes ``triton``,
# ``tl``, ``HAVE_TRITON`` and the jit helpers of ``ops.triton_jit``): its import took 0.3-0.7 s, which
# ``import ostinato`` no longer pays; a model's load asks for it on a helper thread
# (``runtime.preparation``), and CPU work never does (``kernels_can_run``).
_JIT_HELPERS = ("pdl_enter", "prefetch_l2", "fast_sigmoid", "swiglu_rounded", "HAVE_GDC")


@functools.lru_cache(maxsize=None)
def _triton_imports() -> bool:
    try:  # pragma: no cover - depends on the installation
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # pragma: no cover
        return False
    return True


def have_triton() -> bool:
    """Whether Triton imports here (imported by the first call). Tests stand in for it here; the
    kernel modules themselves always see the real answer (``HAVE_TRITON``)."""
    return _triton_imports()


def __getattr__(name: str):
    """``triton``, ``tl`` (None without Triton), ``HAVE_TRITON`` and the shared jit helpers
    (``ops.triton_jit``), imported at the first lookup."""
    if name == "HAVE_TRITON":
        return _triton_imports()
    if name in ("triton", "tl"):
        return importlib.import_module("triton" if name == "triton" else "triton.language") if _triton_imports() else None
    if name in _JIT_HELPERS and _triton_imports():
        return getattr(importlib.import_module(f"{__package__}.triton_jit"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


HALF_DTYPES = (torch.float16, torch.bfloat16)


def kernels_can_run(where, dtype: Optional[torch.dtype] = None, interpreter: bool = False) -> bool:
    """Whether ostinato's Triton kernels run here for ``where`` (a device, its name, or a tensor on
    it): Triton importable, not switched off (OSTINATO_NO_TRITON=1), a CUDA device (or, with
    ``interpreter``, any device under Triton's CPU interpreter: kernels that support it), and,
    when ``dtype`` is given, a half precision one (float32 keeps PyTorch's ops everywhere)."""
    if settings.triton_disabled():
        return False
    if dtype is not None and dtype not in HALF_DTYPES:
        return False
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    if interpreter and settings.triton_interpreter():
        return have_triton()
    # Triton is imported only where a kernel could run: CPU work never pays for it
    return device.type == "cuda" and torch.cuda.is_available() and have_triton()


@functools.lru_cache(maxsize=None)
def _pdl_capable(index: int) -> bool:
    if not _triton_imports():  # no Triton: no kernel to launch with PDL
        return False
    from . import triton_jit

    return triton_jit.HAVE_GDC and torch.cuda.get_device_capability(index)[0] >= 9


# Rows past which a launch goes without PDL. A few rows make small, short kernels whose launch PDL
# hides; many rows make kernels that fill the SMs, and launched early those wait on the SMs that the
# kernel before them still needs (Whisper large-v3 on an H100, one hour: 16 windows x 5 beams, 80
# rows, 5.27 s with PDL on all but the linears, 5.07 without; one window, 5 rows, 23.7 s with, 24.6
# without).
PDL_MAX_ROWS = 16


def pdl_options(device: torch.device, rows: int) -> dict:
    """Launch keywords for a kernel with a ``PDL`` constexpr that begins with ``if PDL: pdl_enter()``;
    ``rows``: the launch's batch rows (PDL only up to ``PDL_MAX_ROWS``; every caller says, so that
    no large launch gets PDL by default)."""
    if device.type != "cuda" or settings.pdl_disabled() or rows > PDL_MAX_ROWS:
        return {"PDL": False}
    if not _pdl_capable(device.index if device.index is not None else torch.cuda.current_device()):
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True}


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device, interpreter_sms: int) -> int:
    """The device's SM count; ``interpreter_sms`` off CUDA (Triton's CPU interpreter has none)."""
    if device.type != "cuda":
        return interpreter_sms
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


ARRIVAL_SLOTS = 4096  # counters per device: enough for every split launch of a Whisper step

_counters: dict = {}  # (device type, index) -> zeroed int32 arrival counters
_retired: list = []  # outgrown counter buffers: captured graphs may still point at them


def arrival_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Zeroed int32 counters for kernels whose last-arriving program finishes a split reduction.

    Each launch's last programs set their counters back to zero, so the counters are zero between
    launches and one buffer serves every such kernel on ``device``: kernels on one stream run one
    after another, and ostinato issues a device's decode work on one stream at a time.
    """
    key = (device.type, device.index)
    buf = _counters.get(key)
    if buf is None or buf.numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A capture records the zeroing and runs none of it: the buffer would stay unzeroed for
            # every launch outside that graph. Refused, so the capture warms up first (StepGraph).
            raise RuntimeError("arrival counters cannot be made during a CUDA graph capture")
        if buf is not None:
            _retired.append(buf)
        buf = torch.zeros(max(ARRIVAL_SLOTS, needed), dtype=torch.int32, device=device)
        _counters[key] = buf
    return buf


# What Triton 3.6's argument specializer (native code behind every binder) imports at its first call,
# to tell tensor descriptors apart: Gluon among them, 0.15 s of a first tiny.en transcription on the
# H100 machine (its installation has no bytecode for them, so they compile from source).
SPECIALIZER_IMPORTS = ("triton.tools.tensor_descriptor", "triton.experimental.gluon.nvidia.hopper")


def prepare(device: torch.device, modules: Sequence[str] = ()) -> None:  # pragma: no cover - needs Triton and CUDA
    """Triton's once-per-process work before its first launch, even of a kernel in its on-disk cache:
    it hashes its own installation (libtriton, hundreds of MB: 0.35 s of a 1.4-s first tiny.en
    transcription on the H100 machine), asks ptxas for its version, parses each loaded kernel's
    source for its cache key and builds its argument binder. Best effort: whatever fails here
    happens at the first launch. ``runtime.preparation`` runs it on a helper thread of its own while
    a model loads, and nothing launches a Triton kernel meanwhile; it also imports what the binders'
    first call would (``SPECIALIZER_IMPORTS``). ``modules``: the model's kernel
    modules, imported here first (with Triton) so that their kernels are among those prepared."""
    if not kernels_can_run(device):
        return
    marks = [("start", time.perf_counter())]  # a debug line says where the time went (dev/load_ab.py prints it)
    try:
        from triton.runtime.cache import triton_key

        marks.append(("import triton", time.perf_counter()))
        # The installation's hash is file reads and hashlib, which let go of the GIL: it runs on a
        # thread of its own beside the imports and the kernels' keys, which hold it.
        hashing = threading.Thread(target=_quietly, args=(triton_key,), name="ostinato-triton-key", daemon=True)
        hashing.start()
        for name in modules:
            importlib.import_module(name)
        marks.append(("kernel modules", time.perf_counter()))
        from triton.compiler.compiler import make_backend
        from triton.runtime import driver

        with torch.cuda.device(device):
            backend = make_backend(driver.active.get_current_target())
            index = driver.active.get_current_device()
        backend.hash()  # ptxas --version, cached
        backend.parse_options({}).hash()  # the PTX version, libdevice's hash
        marks.append(("backend", time.perf_counter()))
        for kernel in loaded_kernels():
            kernel.cache_key  # noqa: B018 - the source's dependency hash, kept on the kernel
            kernel.device_caches[index]  # its argument binder: generated Python, compiled (2 ms a kernel)
        marks.append(("keys and binders", time.perf_counter()))
        for name in SPECIALIZER_IMPORTS:
            importlib.import_module(name)
        marks.append(("specializer imports", time.perf_counter()))
        hashing.join()  # lru-cached: every later cache key reuses it
        marks.append(("waiting for the installation's hash", time.perf_counter()))
        log.debug("Triton prepared in %.3f s: %s", marks[-1][1] - marks[0][1],
                  ", ".join(f"{label} {end - begin:.3f}" for (_, begin), (label, end) in zip(marks, marks[1:])))
    except Exception as exc:  # noqa: BLE001 - only an early start; the first launch does it otherwise
        log.debug("Triton preparation in the background failed: %s", exc)


def _quietly(work) -> None:
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - only an early start; the first launch does it otherwise
        log.debug("Triton preparation in the background failed: %s", exc)


def loaded_kernels():
    """ostinato's Triton kernels in the modules imported so far."""
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if name.startswith("ostinato.") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, JITFunction):
                    yield value
