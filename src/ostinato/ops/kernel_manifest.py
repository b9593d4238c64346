"""The Triton kernels a model's earlier processes launched, loaded again while the model loads.

A process pays for each kernel specialization at its first launch, even when Triton finds it in its
disk cache: the metadata and binary read back, a launcher made, the binary loaded on the device,
2-3 ms each, and a first tiny.en transcription at batch 16 launches about 40 of them. So a model
remembers, by name (its shapes and dtype), which of ostinato's specializations its processes
launched: Triton's own serialized form of each, through its post-compile hook (``record``), kept in
a manifest inside Triton's cache folder (wiped with it) when the process ends. The next load of a
model of that name brings them back on its Triton helper thread before anything launches
(``preload``: ``JITFunction.preload``, then the device load), beside the weights' read, for at
most ``PRELOAD_BUDGET_S``. Only kernels whose compiled files are in the cache and that were built
from the same kernel source, Triton and device come back, so a load does not compile (a changed
CUDA toolchain under the same Triton would still compile one there instead of at its first launch);
anything that fails is left to the first launch, as before.
``OSTINATO_NO_KERNEL_MANIFEST=1`` switches it off.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict

import torch

from .. import settings
from . import triton_support

log = logging.getLogger(__name__)

FOLDER = "ostinato-kernels"  # inside Triton's cache folder
MAX_ENTRIES = 1024  # per manifest: the most recent are kept
# The most a load spends bringing kernels back (2-3 ms each, in the order the earlier processes first
# launched them): the helper may already be the load's critical path (tiny.en's is).
PRELOAD_BUDGET_S = 0.25
PREFIX = "ostinato."  # whose kernels are recorded

_lock = threading.Lock()
_recording: Dict[str, Dict[str, dict]] = {}  # manifest name -> entries recorded by this process
_installed = False


def enabled() -> bool:
    return not settings.kernel_manifest_disabled()


def cache_folder() -> Path:
    from triton import knobs

    return Path(knobs.cache.dir)


def manifest_path(name: str) -> Path:
    return cache_folder() / FOLDER / f"{name}.json"


def record(name: str) -> None:  # pragma: no cover - needs Triton and CUDA
    """Remember, under ``name``, every ostinato kernel specialization this process compiles or loads
    from here on; the manifest is written when the process ends. Best effort."""
    global _installed
    if not enabled():
        return
    try:
        from triton import knobs

        with _lock:
            _recording.setdefault(name, {})
            if not _installed:
                previous = knobs.runtime.jit_post_compile_hook
                knobs.runtime.jit_post_compile_hook = _chained(previous)
                atexit.register(save)
                _installed = True
    except Exception as exc:  # noqa: BLE001 - only a head start for the next process
        log.debug("kernel manifest: recording failed: %s", exc)


def _chained(previous):
    def hook(**kwargs):
        result = previous(**kwargs) if previous is not None else None
        _note(**kwargs)
        return result

    return hook


def _note(*, key, fn, compile, **_) -> None:
    """The post-compile hook's work: never raises (it runs inside a kernel launch)."""
    try:
        jit = fn.jit_function
        name = getattr(jit, "_fn_name", "")
        if not name.startswith(PREFIX):
            return
        kernel_cache, _, target = jit.device_caches[compile["device"]][:3]
        compiled = kernel_cache.get(key)
        paths = list(getattr(compiled, "metadata_group", {}).values())  # its files in Triton's cache
        entry = dict(kernel=name, key=key, data=compile["specialization_data"],
                     files=Path(paths[0]).parent.name if paths else None,
                     built=_built(jit, target))
        with _lock:
            for entries in _recording.values():
                entries[f"{name} {key}"] = entry
    except Exception as exc:  # noqa: BLE001
        log.debug("kernel manifest: a specialization was not recorded: %s", exc)


def _built(jit, target) -> str:
    """What a kernel's cached files were built from: its source (with what it calls), Triton's
    version and the device's target. An entry built otherwise would compile at the load: skipped."""
    import triton

    return f"{jit.cache_key} {triton.__version__} {target}"


def save() -> None:
    """Merge what this process recorded into each manifest (written whole, then renamed into place)."""
    with _lock:
        recorded = {name: dict(entries) for name, entries in _recording.items() if entries}
    for name, entries in recorded.items():
        try:
            path = manifest_path(name)
            merged = {f"{e['kernel']} {e['key']}": e for e in _read(path)}
            merged.update(entries)
            kept = list(merged.values())[-MAX_ENTRIES:]
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
                json.dump(kept, out)
            os.replace(out.name, path)
        except Exception as exc:  # noqa: BLE001
            log.debug("kernel manifest %s not written: %s", name, exc)


def _read(path: Path) -> list:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict) and {"kernel", "key", "data", "files", "built"} <= set(e)]


def manifest_name(family: str, *parts) -> str:
    """A manifest's name for a model: its family and a digest of what shapes its kernels (``parts``:
    its dimensions, dtype...)."""
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]
    return f"{family}-{digest}"


def resume(name: str, device: torch.device) -> None:  # pragma: no cover - needs Triton and CUDA
    """What a model's load runs on its Triton helper: bring back the kernels ``name``'s earlier
    processes launched, then record this process's for the next."""
    count = preload(name, device)
    log.debug("kernel manifest %s: %d specializations preloaded", name, count)
    record(name)


def preload(name: str, device: torch.device) -> int:
    """Load the specializations ``name``'s manifest lists (those whose files are in Triton's cache)
    into their kernels, on ``device``, before any launch; returns how many. Runs after
    ``triton_support.prepare`` on its thread (the kernels' binders exist; nothing else touches them)."""
    if not enabled() or not triton_support.kernels_can_run(device):
        return 0
    loaded = 0
    try:
        entries = _read(manifest_path(name))
        if not entries:
            return 0
        kernels = {getattr(k, "_fn_name", None): k for k in triton_support.loaded_kernels()}
        cache = cache_folder()
        deadline = time.perf_counter() + PRELOAD_BUDGET_S
        with torch.cuda.device(device):
            index = torch.cuda.current_device()
            for entry in entries:
                if time.perf_counter() > deadline:
                    break  # the rest at their first launch, as before
                kernel = kernels.get(entry["kernel"])
                if kernel is None or not entry["files"] or not (cache / entry["files"]).is_dir():
                    continue  # a kernel no longer here, or files no longer cached: the launch compiles
                kernel_cache, _, target = kernel.device_caches[index][:3]
                if entry["key"] in kernel_cache or entry["built"] != _built(kernel, target):
                    continue  # here already; or changed since (source, Triton, device): would compile
                try:
                    compiled = kernel.preload(entry["data"])
                    compiled.run  # noqa: B018 - the binary loaded on the device, its launcher made
                    loaded += 1
                except Exception as exc:  # noqa: BLE001 - left to the first launch
                    log.debug("kernel manifest: %s not preloaded: %s", entry["kernel"], exc)
    except Exception as exc:  # noqa: BLE001
        log.debug("kernel manifest %s not preloaded: %s", name, exc)
    return loaded
