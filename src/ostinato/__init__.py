"""ostinato: autoregressive speech and language decoding at the GPU's limit."""
from .errors import (
    AudioError,
    GraphInputError,
    InvalidOptionError,
    ModelLoadError,
    OstinatoError,
    UnsupportedCheckpointError,
)

__version__ = "0.1.0"

# Model classes pull in torch; they load on first use so `ostinato --help` and error types stay cheap.
_LAZY = {
    "Segment": "ostinato.results",
    "TranscriptionInfo": "ostinato.results",
    "Word": "ostinato.results",
    "WhisperModel": "ostinato.models.whisper.model",
    "load_model": "ostinato.loading",
    "TransducerModel": "ostinato.models.transducer.model",
    "LanguageModel": "ostinato.models.llm.model",
    "Generation": "ostinato.models.llm.model",
    "TransducerResult": "ostinato.models.transducer.model",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ostinato' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AudioError",
    "Generation",
    "GraphInputError",
    "InvalidOptionError",
    "LanguageModel",
    "ModelLoadError",
    "OstinatoError",
    "Segment",
    "TranscriptionInfo",
    "TransducerModel",
    "TransducerResult",
    "UnsupportedCheckpointError",
    "WhisperModel",
    "Word",
    "__version__",
    "load_model",
]
