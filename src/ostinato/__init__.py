"""ostinato: autoregressive speech and language decoding at the GPU's limit."""
from .errors import (
    AudioError,
    GraphInputError,
    InvalidOptionError,
    ModelLoadError,
    OstinatoError,
    UnsupportedCheckpointError,
)
from .models.whisper import Segment, TranscriptionInfo, WhisperModel, Word

__version__ = "0.1.0"

__all__ = [
    "AudioError",
    "GraphInputError",
    "InvalidOptionError",
    "ModelLoadError",
    "OstinatoError",
    "Segment",
    "TranscriptionInfo",
    "UnsupportedCheckpointError",
    "WhisperModel",
    "Word",
    "__version__",
]
