"""Whisper: model code, checkpoint loaders, decoding and transcription."""
from .config import OFFICIAL_DIMS, WhisperDims

__all__ = ["OFFICIAL_DIMS", "WhisperDims", "WhisperModel"]


def __getattr__(name: str):
    # WhisperModel pulls in torch; loaded on first use so the options module imports without it.
    if name == "WhisperModel":
        from .model import WhisperModel

        return WhisperModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
