"""Every environment switch ostinato reads, in one place, read when asked (not at import), so a
switch set after ``import ostinato`` still counts."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List, Optional


def _on(name: str) -> bool:
    return os.environ.get(name) == "1"


def triton_disabled() -> bool:
    """OSTINATO_NO_TRITON=1: run the plain PyTorch paths instead of the Triton kernels (default: off)."""
    return _on("OSTINATO_NO_TRITON")


def pdl_disabled() -> bool:
    """OSTINATO_NO_PDL=1: launch kernels without programmatic dependent launch (default: PDL on Hopper+)."""
    return _on("OSTINATO_NO_PDL")


def prefetch_disabled() -> bool:
    """OSTINATO_NO_PREFETCH=1: kernels launched with PDL do not ask L2 for their weights and keys before
    waiting on the kernel ahead (default: they do where the caller asks, e.g. a Whisper decode step)."""
    return _on("OSTINATO_NO_PREFETCH")


def kernel_manifest_disabled() -> bool:
    """OSTINATO_NO_KERNEL_MANIFEST=1: a model's load does not bring back the Triton kernels its earlier
    processes launched, nor record them (``ops.kernel_manifest``; default: it does, on CUDA)."""
    return _on("OSTINATO_NO_KERNEL_MANIFEST")


def triton_interpreter() -> bool:
    """TRITON_INTERPRET=1 (Triton's own switch): kernels run on the CPU interpreter, for tests."""
    return _on("TRITON_INTERPRET")


def vad_backend() -> Optional[str]:
    """OSTINATO_VAD_BACKEND=onnx|torch: how the Silero VAD runs (default: unset, onnxruntime on the CPU
    and PyTorch on CUDA; see ostinato.audio.vad)."""
    value = os.environ.get("OSTINATO_VAD_BACKEND", "").strip().lower()
    return value or None


def api_key() -> Optional[str]:
    """OSTINATO_API_KEY: the bearer key ``ostinato serve`` asks for when --api-key is not given (default: none)."""
    return os.environ.get("OSTINATO_API_KEY")


def cache_dirs() -> List[Path]:
    """Where ostinato caches what it builds (vocabularies), first choice first: OSTINATO_CACHE, else
    $XDG_CACHE_HOME/ostinato (default ~/.cache/ostinato), then a per-user folder in the temp dir."""
    explicit = os.environ.get("OSTINATO_CACHE")
    if explicit:
        return [Path(explicit).expanduser()]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    user = f"ostinato-{os.getuid()}" if hasattr(os, "getuid") else "ostinato"
    return [Path(xdg) / "ostinato", Path(tempfile.gettempdir()) / user]


# The Hugging Face hub's own variables, read as huggingface_hub reads them, but when asked:
# huggingface_hub reads them once at import, which would miss a change made later in the process.
def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> str:
    """HF_HUB_CACHE (or HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub (HF_HOME default: ~/.cache/huggingface)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    home = os.environ.get("HF_HOME", os.path.join(xdg, "huggingface"))
    return os.path.join(os.path.expanduser(home), "hub")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set: never reach for the hub (default: online)."""
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))
