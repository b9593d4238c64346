"""Whisper: model code, checkpoint loaders, decoding and transcription."""
from .config import OFFICIAL_DIMS, WhisperDims
from .model import WhisperModel
from ...results import Segment, TranscriptionInfo, Word

__all__ = ["OFFICIAL_DIMS", "Segment", "TranscriptionInfo", "WhisperDims", "WhisperModel", "Word"]
