"""Choosing the device and the compute dtype, with clear errors for impossible requests."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import re
import threading
from typing import Optional

import torch

from ..errors import InvalidOptionError

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def parse_device(device: str | torch.device) -> torch.device | str:
    """The device a name asks for ("auto" stays "auto"), without looking for it: raises
    ``InvalidOptionError`` for a name that is not auto, cpu, cuda or cuda:N."""
    if isinstance(device, torch.device):
        resolved = device
    else:
        name = str(device).strip().lower()
        if name == "auto":
            return "auto"
        try:
            resolved = torch.device(name)
        except RuntimeError:
            raise InvalidOptionError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if resolved.type not in ("cpu", "cuda"):
        raise InvalidOptionError(f"unsupported device {device!r}: use auto, cpu, cuda or cuda:N")
    return resolved


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' picks the first CUDA device when there is one, else the CPU."""
    resolved = parse_device(device)
    if resolved == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidOptionError(f"device {device!r} was requested but no CUDA device is available")
        index = resolved.index if resolved.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise InvalidOptionError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) found")
        return torch.device("cuda", index)
    return resolved


def resolve_dtype(compute_type: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is float16 on CUDA and float32 on the CPU. As faster-whisper does, 'float16' or
    'bfloat16' asked for on the CPU fall back to float32 with one warning (half precision is slow
    there); a ``torch.dtype`` is taken as it is, on any device (tests, experiments)."""
    if isinstance(compute_type, torch.dtype):
        if compute_type not in _DTYPES.values():
            raise InvalidOptionError(f"unsupported compute type {compute_type}")
        dtype = compute_type
    else:
        name = str(compute_type).strip().lower()
        if name == "auto":
            return torch.float16 if device.type == "cuda" else torch.float32
        if name not in _DTYPES:
            raise InvalidOptionError(
                f"unknown compute type {compute_type!r}: use auto, {', '.join(_DTYPES)}"
            )
        dtype = _DTYPES[name]
        if device.type == "cpu" and dtype != torch.float32:
            logging.getLogger(__name__).warning(
                "compute type %s is not efficient on the CPU: computing in float32 instead", name
            )
            dtype = torch.float32
    return dtype


@contextlib.contextmanager
def strict_float32(device: torch.device, dtype: torch.dtype):
    """float32 compute means IEEE float32 on CUDA too: no TF32 in convolutions or matrix products.

    cuDNN convolutions default to TF32 on Ampere and newer, which is enough to flip near-tied
    tokens against the CPU; the flags are restored on exit.
    """
    if device.type != "cuda" or dtype != torch.float32:
        yield
        return
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


_SIDE_STREAMS: dict = {}


def side_stream(device: torch.device, purpose: str, priority: int = 0):
    """The CUDA side stream for ``purpose`` on ``device``, made once per process. A stream is worth
    keeping: cuBLAS holds a workspace (32 MiB on Hopper) for every stream it has run on, for the life
    of the process, so a new stream per call would grow memory call after call. ``priority``: lower
    is more urgent (CUDA clamps it to the device's range); the GPU schedules a more urgent stream's
    blocks first when several streams have work waiting."""
    key = (torch.device(device), purpose)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = torch.cuda.Stream(device, priority=priority)
    return stream


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity set, capped by a cgroup CPU quota (containers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _cgroup_cpu_quota() -> Optional[float]:
    """CPUs' worth of time a cgroup grants per period (cgroup v2, then v1), or None: no quota."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            period = int(f.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def physical_cores(cpus: Optional[set] = None) -> int:
    """Physical cores among ``cpus`` (default: this process's affinity set); hyperthreads share a
    core's arithmetic units, so matrix work gains nothing from them."""
    try:
        cpus = set(os.sched_getaffinity(0)) if cpus is None else cpus
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as a, open(topology + "core_id") as b:
                cores.add((a.read().strip(), b.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology: count the CPU as a core
    return max(1, len(cores))


def default_cpu_threads() -> int:
    """The intra-op threads ``cpu_threads=0`` asks for: one per physical core this process may use."""
    return max(1, min(physical_cores(), usable_cpus()))


def set_cpu_threads(cpu_threads: int = 0, device: Optional[torch.device] = None) -> int:
    """Set PyTorch's intra-op thread count for CPU work; returns the count in use.

    ``cpu_threads > 0`` is taken as given (a warning when it exceeds the CPUs this process may use).
    0 (the default) on the CPU lowers PyTorch's count to ``default_cpu_threads()`` where it is
    higher, and leaves it alone otherwise: an ``OMP_NUM_THREADS`` or an earlier
    ``torch.set_num_threads`` that asked for fewer stays. The count is process-wide (PyTorch has
    one intra-op pool), so the last model created with a non-zero value sets it for all."""
    if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 0:
        raise InvalidOptionError(f"cpu_threads must be an integer >= 0 (0: one per physical core), got {cpu_threads!r}")
    if cpu_threads > 0:
        usable = usable_cpus()
        if cpu_threads > usable:
            logging.getLogger(__name__).warning(
                "cpu_threads=%d is more than the %d CPU(s) this process may use: threads will wait for each other",
                cpu_threads, usable)
        torch.set_num_threads(cpu_threads)
    elif (device is None or torch.device(device).type == "cpu") and "OMP_NUM_THREADS" not in os.environ:
        wanted = default_cpu_threads()
        if torch.get_num_threads() > wanted:
            torch.set_num_threads(wanted)
    return torch.get_num_threads()


def one_cpu_thread_here() -> bool:
    """Run the calling thread's PyTorch CPU ops on that thread alone; returns whether it took.

    For helper threads that do a little host work beside a thread that runs the model (the
    engine's per-audio workers). A PyTorch op big enough to parallelise gives the calling thread
    an OpenMP team of its own; once the process has more OpenMP threads than CPUs, GNU OpenMP
    stops letting idle team members spin, so every parallel region of the model's thread then
    waits for its members to wake: on the 2-core machine one audio's beam-5 decode took 1.5 s
    through the engine against 1.2 s alone, every operator 1.5-2x slower. The OpenMP count is
    per thread: set to 1 here (after PyTorch's own first setting of it for this thread), no other
    thread is touched. Without an OpenMP runtime in the process, nothing changes.
    """
    torch.get_num_threads()  # PyTorch sets a thread's OpenMP count on its first use: let it, first
    runtime = openmp_runtime()
    if runtime is None:
        return False
    runtime.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


_openmp_lock = threading.Lock()
_openmp: list = []  # [the runtime or None], once looked up


def openmp_runtime():
    """The OpenMP runtime PyTorch loaded into this process (GNU, Intel or LLVM), if one can be found.

    Looked up once per process, by one thread: the lookup reads ``/proc/self/maps``, which in a
    process holding a CUDA context has thousands of lines (16-20 ms on an H200 host), and a first
    ``transcribe_batch`` starts up to 64 workers that all ask at once. A model's load asks early
    (``runtime.preparation``), so its first call does not.
    """
    with _openmp_lock:
        if not _openmp:
            _openmp.append(_find_openmp_runtime())
        return _openmp[0]


def _find_openmp_runtime():
    try:
        with open("/proc/self/maps") as maps:
            paths = set(re.findall(r"\S*/lib(?:gomp|iomp5|omp)[^/\s]*\.so[^/\s]*$", maps.read(), re.MULTILINE))
    except OSError:  # not Linux
        return None
    for path in sorted(paths):
        try:
            runtime = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(runtime, "omp_set_num_threads"):
            return runtime
    return None
