"""What a transcription returns, whatever the model family: segments, words and information about
the audio, field-compatible with faster-whisper's (Whisper fills every field; a transducer the
ones it has)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: List[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: Optional[List[Word]] = None
    temperature: Optional[float] = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    all_language_probs: Optional[List[tuple]] = None
    transcription_options: dict = field(default_factory=dict)
    duration_after_vad: Optional[float] = None  # seconds of audio left after the VAD (Whisper: duration without one)
    vad_options: Optional[dict] = None  # the VAD's options, when it ran

    def to_dict(self) -> dict:
        return asdict(self)
