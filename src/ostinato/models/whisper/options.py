"""Whisper's transcription options: one dataclass that the API, the command line, the batch engine
and the server build and validate the same way, with faster-whisper's names and defaults."""
from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, List, Optional, Sequence, Union

from ...checks import check_positive_int
from ...errors import InvalidOptionError
from .search import max_candidates

if TYPE_CHECKING:  # the VAD module imports torch; this module stays free of it
    from ...audio.vad import VadOptions

MAX_TEXT_TOKENS = 448  # Whisper's text context
TASKS = ("transcribe", "translate")  # what Whisper can be asked to do
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's fallback schedule
DEFAULT_PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # word timestamps: merged into the word that follows
DEFAULT_APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # word timestamps: merged into the word before


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_clip_timestamps(value: Union[str, Sequence[float]]) -> List[float]:
    """faster-whisper's ``clip_timestamps``: "start,end,start,end,..." seconds (a string or a list).

    An empty string or list means the whole audio; an odd count leaves the last clip open to the
    end. Raises InvalidOptionError for anything that is not a list of finite numbers >= 0 with
    each clip's end after its start.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            points = [float(part) for part in text.split(",")] if text else []
        except ValueError:
            raise InvalidOptionError(
                f"clip_timestamps must be comma-separated seconds like '0,10,15', got {value!r}"
            ) from None
    else:
        try:
            if isinstance(value, bytes):
                raise TypeError
            points = list(value)
        except TypeError:
            raise InvalidOptionError(f"clip_timestamps must be a string or a list of seconds, got {value!r}") from None
        if not all(_is_number(p) for p in points):
            raise InvalidOptionError(f"clip_timestamps must hold numbers of seconds, got {value!r}")
        points = [float(p) for p in points]
    if any(not math.isfinite(p) or p < 0 for p in points):
        raise InvalidOptionError(f"clip_timestamps must be finite seconds >= 0, got {value!r}")
    for start, end in zip(points[::2], points[1::2]):
        if end <= start:
            raise InvalidOptionError(f"clip_timestamps: a clip ends ({end}) before it starts ({start})")
    return points


def _check_token_ids(name: str, ids, lowest: int, n_vocab: Optional[int]) -> None:
    """``ids`` must be a sequence of integers in [lowest, n_vocab): raise InvalidOptionError otherwise."""
    try:
        if isinstance(ids, (str, bytes)):
            raise TypeError
        values = [operator.index(t) for t in ids]
    except TypeError:
        raise InvalidOptionError(f"{name} must be a sequence of integer token ids, got {ids!r}") from None
    bad = [t for t in values if t < lowest or (n_vocab is not None and t >= n_vocab)]
    if bad:
        raise InvalidOptionError(f"{name} holds token ids outside the model's vocabulary: {bad[:5]}")


@dataclass
class TranscribeOptions:
    """How ``transcribe`` works on one audio; faster-whisper's names and defaults."""

    language: Optional[str] = None  # spoken language code; None: detected on the first window
    task: str = "transcribe"  # "transcribe", or "translate" into English
    beam_size: int = 5  # beams of the search at temperature 0 (1: greedy)
    best_of: int = 5  # independent samples per window at temperatures above 0; the best is kept
    patience: float = 1.0  # a beam search stops after round(beam_size * patience) finished hypotheses
    length_penalty: float = 1.0  # hypotheses rank by sum of log-probabilities / length ** this
    repetition_penalty: float = 1.0  # logits of tokens already generated are divided (> 1: fewer repeats)
    no_repeat_ngram_size: int = 0  # forbid repeating an n-gram of this size (0: off)
    temperature: Union[float, Sequence[float]] = DEFAULT_TEMPERATURES  # one, or a fallback schedule
    initial_prompt: Optional[Union[str, Sequence[int]]] = None  # text or token ids before the first window
    without_timestamps: Optional[bool] = None  # no timestamp tokens, one segment per window (None: when batched)
    condition_on_previous_text: bool = True  # prompt each window with the text decoded before it
    prompt_reset_on_temperature: float = 0.5  # drop that prompt after a fallback to this temperature or above
    compression_ratio_threshold: Optional[float] = 2.4  # above: the window is repetitive, fall back
    log_prob_threshold: Optional[float] = -1.0  # below this average log-probability: fall back
    no_speech_threshold: Optional[float] = 0.6  # above this no-speech probability (and a low log-prob): skip
    suppress_blank: bool = True  # no blank or end-of-text as a window's first token
    suppress_tokens: Optional[Sequence[int]] = field(default_factory=lambda: [-1])  # never emitted; -1: symbols
    max_initial_timestamp: float = 1.0  # the first timestamp of a window is at most this many seconds
    max_new_tokens: Optional[int] = None  # tokens a window may generate (None: half the text context)
    word_timestamps: bool = False  # time every word from the cross-attention of the alignment heads
    prepend_punctuations: str = DEFAULT_PREPEND_PUNCTUATIONS  # merged into the word that follows
    append_punctuations: str = DEFAULT_APPEND_PUNCTUATIONS  # merged into the word before
    hallucination_silence_threshold: Optional[float] = None  # skip silences this long around hallucinations
    prefix: Optional[str] = None  # text the first window's transcript must start with
    hotwords: Optional[str] = None  # words to prompt the model with (ignored when a prefix is given)
    clip_timestamps: Union[str, Sequence[float]] = "0"  # "start,end,..." seconds to transcribe
    seed: Optional[int] = 0  # sampling seed; None: a fresh random seed per call
    vad_filter: Optional[bool] = None  # keep only the speech Silero VAD finds (None: on when batched)
    vad_parameters: Optional[Union[dict, "VadOptions"]] = None  # faster-whisper's VadOptions, or a dict of them
    batched: bool = False  # faster-whisper's BatchedInferencePipeline: the VAD's chunks decoded together

    def __post_init__(self):
        # Defaults that depend on ``batched``, as faster-whisper's two transcribe methods have them.
        if self.vad_filter is None:
            self.vad_filter = bool(self.batched)
        if self.without_timestamps is None:
            self.without_timestamps = bool(self.batched)

    def validate(self, n_vocab: Optional[int] = None) -> None:
        if self.language is not None and (not isinstance(self.language, str) or not self.language.strip()):
            raise InvalidOptionError(f"language must be a code such as 'en' (unset: detected), got {self.language!r}")
        if self.task not in TASKS:
            raise InvalidOptionError(f"unknown task {self.task!r}: use {' or '.join(map(repr, TASKS))}")
        for name in ("beam_size", "best_of"):
            check_positive_int(name, getattr(self, name))
        try:
            temps = self.temperatures
        except (TypeError, ValueError):
            temps = None
        if not temps:
            raise InvalidOptionError("temperature must be a number or a non-empty list of numbers")
        if any(not math.isfinite(t) or t < 0 for t in temps):
            raise InvalidOptionError(f"temperatures must be finite and >= 0, got {list(temps)}")
        if not _is_number(self.patience) or not math.isfinite(self.patience) or self.patience <= 0:
            raise InvalidOptionError(f"patience must be a number > 0, got {self.patience!r}")
        if max_candidates(self.beam_size, self.patience) < 1:
            raise InvalidOptionError(
                f"patience ({self.patience}) times beam_size ({self.beam_size}) must round to at least 1"
            )
        if not _is_number(self.length_penalty) or not math.isfinite(self.length_penalty):
            raise InvalidOptionError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        penalty = self.repetition_penalty
        if not _is_number(penalty) or not math.isfinite(penalty) or penalty <= 0:
            raise InvalidOptionError(f"repetition_penalty must be a number > 0, got {penalty!r}")
        size = self.no_repeat_ngram_size
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < MAX_TEXT_TOKENS:
            raise InvalidOptionError(f"no_repeat_ngram_size must be an integer >= 0, got {size!r}")
        for name in ("compression_ratio_threshold", "log_prob_threshold"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or math.isnan(value)):
                raise InvalidOptionError(f"{name} must be a number or None, got {value!r}")
        if not _is_number(self.prompt_reset_on_temperature) or math.isnan(self.prompt_reset_on_temperature):
            raise InvalidOptionError(
                f"prompt_reset_on_temperature must be a number, got {self.prompt_reset_on_temperature!r}"
            )
        for name in ("prefix", "hotwords"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidOptionError(f"{name} must be a string or None, got {value!r}")
        parse_clip_timestamps(self.clip_timestamps)  # raises for a malformed list
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
            raise InvalidOptionError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
        if self.max_new_tokens is not None:
            check_positive_int("max_new_tokens", self.max_new_tokens)
        if self.max_new_tokens is not None and self.max_new_tokens >= MAX_TEXT_TOKENS:  # the prompt takes >= 1
            raise InvalidOptionError(
                f"max_new_tokens ({self.max_new_tokens}) must be less than Whisper's {MAX_TEXT_TOKENS}-token context"
            )
        if self.suppress_tokens is not None:
            _check_token_ids("suppress_tokens", self.suppress_tokens, -1, n_vocab)  # -1: the non-speech set
        if self.initial_prompt is not None and not isinstance(self.initial_prompt, str):
            _check_token_ids("initial_prompt", self.initial_prompt, 0, n_vocab)
        if self.max_initial_timestamp < 0:
            raise InvalidOptionError("max_initial_timestamp must be >= 0")
        if self.no_speech_threshold is not None and not 0.0 <= self.no_speech_threshold <= 1.0:
            raise InvalidOptionError("no_speech_threshold must lie between 0 and 1")
        for name in ("prepend_punctuations", "append_punctuations"):
            if not isinstance(getattr(self, name), str):
                raise InvalidOptionError(f"{name} must be a string, got {getattr(self, name)!r}")
        threshold = self.hallucination_silence_threshold
        if threshold is not None and not (_is_number(threshold) and threshold >= 0):
            raise InvalidOptionError(f"hallucination_silence_threshold must be a number >= 0, got {threshold!r}")
        for name in ("without_timestamps", "vad_filter", "batched"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOptionError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.vad_filter or self.vad_parameters is not None:
            from ...audio.vad import vad_options

            vad_options(self.vad_parameters)  # raises for unknown names and bad values
        if self.runs_vad:
            from ...audio.vad import require_vad

            require_vad("vad_filter (on with batched)" if self.batched else "vad_filter")

    @property
    def runs_vad(self) -> bool:
        """Whether the VAD runs: ``vad_filter`` without ``clip_timestamps`` (faster-whisper ignores the
        VAD when clips are given)."""
        return bool(self.vad_filter) and isinstance(self.clip_timestamps, str) and self.clip_timestamps == "0"

    @property
    def temperatures(self) -> List[float]:
        t = self.temperature
        return [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]

    @property
    def rows_per_window(self) -> int:
        """Decoder rows one window takes at most: ``beam_size`` at temperature 0, ``best_of`` above it
        (``best_of`` takes none where no temperature samples)."""
        temps = self.temperatures
        beams = self.beam_size if 0.0 in temps else 1
        samples = self.best_of if any(t > 0 for t in temps) else 1
        return max(beams, samples)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_temperature(text: str) -> Union[float, tuple]:
    """``temperature`` from text: one number, or comma-separated numbers (a fallback schedule);
    ``validate`` checks the values."""
    try:
        values = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise InvalidOptionError(f"temperature must be a number or comma-separated numbers, got {text!r}") from None
    return values[0] if len(values) == 1 else tuple(values)
