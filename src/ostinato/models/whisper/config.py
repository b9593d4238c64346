"""Whisper model dimensions, named as in OpenAI's checkpoints (the canonical in-memory form)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class WhisperDims:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        # English-only vocabularies have 51864 entries; multilingual ones 51865 (51866 for large-v3).
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        # large-v3 added Cantonese: one more language token.
        return self.n_vocab - 51765 - int(self.is_multilingual)

    def to_dict(self) -> dict:
        return asdict(self)


# The official sizes, for documentation, tests and random-weight benchmarks.
OFFICIAL_DIMS = {
    "tiny": WhisperDims(80, 1500, 384, 6, 4, 51865, 448, 384, 6, 4),
    "tiny.en": WhisperDims(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4),
    "base": WhisperDims(80, 1500, 512, 8, 6, 51865, 448, 512, 8, 6),
    "base.en": WhisperDims(80, 1500, 512, 8, 6, 51864, 448, 512, 8, 6),
    "small": WhisperDims(80, 1500, 768, 12, 12, 51865, 448, 768, 12, 12),
    "small.en": WhisperDims(80, 1500, 768, 12, 12, 51864, 448, 768, 12, 12),
    "medium": WhisperDims(80, 1500, 1024, 16, 24, 51865, 448, 1024, 16, 24),
    "medium.en": WhisperDims(80, 1500, 1024, 16, 24, 51864, 448, 1024, 16, 24),
    "large-v2": WhisperDims(80, 1500, 1280, 20, 32, 51865, 448, 1280, 20, 32),
    "large-v3": WhisperDims(128, 1500, 1280, 20, 32, 51866, 448, 1280, 20, 32),
    "large-v3-turbo": WhisperDims(128, 1500, 1280, 20, 32, 51866, 448, 1280, 20, 4),
}
