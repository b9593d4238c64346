"""Choosing the device and the compute dtype, with clear errors for impossible requests."""
from __future__ import annotations

import contextlib

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
            import logging

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
