"""The window loop: 30-s windows with timestamp-based seeking, prompts from earlier text, no-speech skips.

It follows faster-whisper's sequential transcription (without VAD) so that the same options give
the same tokens; the model work (encoding, decoding a window) is delegated to a ``WindowRunner``.
"""
from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import InvalidOptionError
from .decoding import SearchOptions, WindowRequest, WindowResult, decode_budget, max_candidates
from .segments import FRAME_SECONDS, FRAMES_PER_SECOND, TIME_PRECISION, compression_ratio, split_by_timestamps
from .tokenizer import WhisperTokenizer
from .types import Segment, Word
from .word_timestamps import (
    DEFAULT_APPEND_PUNCTUATIONS,
    DEFAULT_PREPEND_PUNCTUATIONS,
    TokenAlignment,
    add_word_timestamps,
    is_segment_anomaly,
    last_word_end,
    next_words_segment,
)

HOP_LENGTH = 160  # samples per mel frame at 16 kHz
N_FRAMES = 3000  # mel frames in a 30-s window
MAX_TEXT_TOKENS = 448
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's fallback schedule


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


def seek_clips(clip_timestamps: Union[str, Sequence[float]], content_frames: int) -> List[Tuple[int, int]]:
    """The (start, end) mel-frame ranges to transcribe, as faster-whisper derives them."""
    points = [round(t * FRAMES_PER_SECOND) for t in parse_clip_timestamps(clip_timestamps)]
    if not points:
        points.append(0)
    if len(points) % 2 == 1:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2]))


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
    language: Optional[str] = None
    task: str = "transcribe"
    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    temperature: Union[float, Sequence[float]] = DEFAULT_TEMPERATURES
    initial_prompt: Optional[Union[str, Sequence[int]]] = None
    without_timestamps: bool = False
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    compression_ratio_threshold: Optional[float] = 2.4
    log_prob_threshold: Optional[float] = -1.0
    no_speech_threshold: Optional[float] = 0.6
    suppress_blank: bool = True
    suppress_tokens: Optional[Sequence[int]] = field(default_factory=lambda: [-1])
    max_initial_timestamp: float = 1.0
    max_new_tokens: Optional[int] = None
    word_timestamps: bool = False
    prepend_punctuations: str = DEFAULT_PREPEND_PUNCTUATIONS
    append_punctuations: str = DEFAULT_APPEND_PUNCTUATIONS
    hallucination_silence_threshold: Optional[float] = None
    prefix: Optional[str] = None
    hotwords: Optional[str] = None
    clip_timestamps: Union[str, Sequence[float]] = "0"
    seed: Optional[int] = 0  # sampling seed; None: a fresh random seed per call

    def validate(self, n_vocab: Optional[int] = None) -> None:
        if self.task not in ("transcribe", "translate"):
            raise InvalidOptionError(f"unknown task {self.task!r}: use 'transcribe' or 'translate'")
        for name in ("beam_size", "best_of"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
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
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise InvalidOptionError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
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

    @property
    def temperatures(self) -> List[float]:
        t = self.temperature
        return [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]

    def to_dict(self) -> dict:
        return asdict(self)


class WindowRunner:
    """What the window loop needs from a model: encode a window, decode windows."""

    def encode(self, mel: torch.Tensor) -> torch.Tensor: ...

    def decode(self, audio_features: torch.Tensor, requests: List[WindowRequest],
               suppress: Sequence[int], suppress_at_begin: Sequence[int],
               options: Optional[SearchOptions] = None) -> List[WindowResult]: ...

    def seed(self, seed: Optional[int]) -> None:
        """Seed the random generator of sampling (temperature > 0); None: a fresh random seed."""

    def align(self, audio_features: torch.Tensor, sot_sequence: List[int],
              text_tokens: List[List[int]], num_frames: int) -> List[TokenAlignment]: ...


def pad_window(features: torch.Tensor, seek: int, size: int) -> torch.Tensor:
    """The mel frames [seek, seek + size) padded with zeros to a full window, as Whisper does."""
    window = features[:, seek : seek + size]
    return F.pad(window, (0, N_FRAMES - window.shape[-1]))


def build_prompt(
    tokenizer: WhisperTokenizer,
    previous: List[int],
    sot_sequence: List[int],
    without_timestamps: bool,
    prefix: Optional[str] = None,
    hotwords: Optional[str] = None,
) -> List[int]:
    """faster-whisper's prompt: [<|startofprev|> hotwords previous-text] SOT-sequence
    [<|notimestamps|>] [<|0.00|> prefix]; hotwords are ignored when there is a prefix."""
    half = MAX_TEXT_TOKENS // 2
    prompt: List[int] = []
    if previous or (hotwords and not prefix):
        prompt.append(tokenizer.sot_prev)
        if hotwords and not prefix:
            hotword_tokens = tokenizer.encode(" " + hotwords.strip())
            prompt.extend(hotword_tokens[: half - 1] if len(hotword_tokens) >= half else hotword_tokens)
        if previous:
            prompt.extend(previous[-(half - 1):])
    prompt.extend(sot_sequence)
    if without_timestamps:
        prompt.append(tokenizer.no_timestamps)
    if prefix:
        prefix_tokens = tokenizer.encode(" " + prefix.strip())
        if len(prefix_tokens) >= half:
            prefix_tokens = prefix_tokens[: half - 1]
        if not without_timestamps:
            prompt.append(tokenizer.timestamp_begin)
        prompt.extend(prefix_tokens)
    return prompt


@dataclass
class DecodeOutcome:
    """One window's chosen decode: the result, faster-whisper's statistics and its temperature."""

    result: WindowResult
    avg_logprob: float
    temperature: float
    compression_ratio: float


def avg_logprob_of(result: WindowResult, length_penalty: float) -> float:
    """faster-whisper's average log-probability, recovered from CTranslate2's normalised score."""
    n = len(result.tokens)
    score = result.score
    if score is None:  # a runner that reports only the sum
        return result.sum_logprob / (n + 1)
    return score * (n**length_penalty) / (n + 1)


def generate_with_fallback(
    runner: WindowRunner,
    tokenizer: WhisperTokenizer,
    audio_features: torch.Tensor,
    prompt: List[int],
    options: TranscribeOptions,
    suppress: Sequence[int],
    suppress_at_begin: Sequence[int],
) -> DecodeOutcome:
    """Decode one window at each temperature of the schedule until the result passes the
    compression-ratio and log-probability checks (faster-whisper's generate_with_fallback).

    Temperature 0 uses beam search (``beam_size``, ``patience``); higher temperatures sample
    ``best_of`` candidates. When every temperature fails, the best-scoring result below the
    compression-ratio threshold (or of all) is kept, reported with the last temperature.
    """
    if options.max_new_tokens is not None:
        max_length = len(prompt) + options.max_new_tokens
        if max_length > MAX_TEXT_TOKENS:
            raise InvalidOptionError(
                f"prompt ({len(prompt)} tokens) plus max_new_tokens ({options.max_new_tokens}) "
                f"exceeds Whisper's {MAX_TEXT_TOKENS}-token context"
            )
    else:
        max_length = MAX_TEXT_TOKENS
    request = WindowRequest(
        prompt=prompt,
        timestamps=not options.without_timestamps,
        max_initial_timestamp_index=int(round(options.max_initial_timestamp / TIME_PRECISION)),
        max_new_tokens=decode_budget(prompt, tokenizer.sot, tokenizer.no_timestamps, max_length),
    )
    common = dict(
        length_penalty=float(options.length_penalty),
        repetition_penalty=float(options.repetition_penalty),
        no_repeat_ngram_size=int(options.no_repeat_ngram_size),
    )
    all_outcomes: List[DecodeOutcome] = []
    below_ratio: List[DecodeOutcome] = []
    outcome = None
    for temperature in options.temperatures:
        if temperature > 0:
            search = SearchOptions(beam_size=1, temperature=temperature, num_hypotheses=options.best_of, **common)
        else:
            search = SearchOptions(beam_size=options.beam_size, patience=float(options.patience), **common)
        result = runner.decode(audio_features, [request], suppress, suppress_at_begin, search)[0]
        avg_logprob = avg_logprob_of(result, options.length_penalty)
        ratio = compression_ratio(tokenizer.decode(result.tokens).strip())
        outcome = DecodeOutcome(result, avg_logprob, temperature, ratio)
        all_outcomes.append(outcome)

        needs_fallback = False
        if options.compression_ratio_threshold is not None:
            if ratio > options.compression_ratio_threshold:
                needs_fallback = True  # too repetitive
            else:
                below_ratio.append(outcome)
        if options.log_prob_threshold is not None and avg_logprob < options.log_prob_threshold:
            needs_fallback = True  # average log probability too low
        if (
            options.no_speech_threshold is not None
            and result.no_speech_prob > options.no_speech_threshold
            and options.log_prob_threshold is not None
            and avg_logprob < options.log_prob_threshold
        ):
            needs_fallback = False  # silence: the caller skips the window
        if not needs_fallback:
            return outcome
    # Every temperature failed: the best average log-probability, with the last temperature.
    best = max(below_ratio or all_outcomes, key=lambda o: o.avg_logprob)
    return DecodeOutcome(best.result, best.avg_logprob, outcome.temperature, best.compression_ratio)


# Windows whose samples never rise above this (about -80 dBFS: a few steps of 16-bit PCM) are
# digital silence. Whisper decodes such windows into stock phrases (" You", " Thank you."), and
# faster-whisper with its default options does too; ostinato skips them as no speech instead.
DIGITAL_SILENCE_PEAK = 1e-4


def frame_peak_amplitudes(samples) -> np.ndarray:
    """The peak |sample| of each 10-ms hop (one mel frame), for the digital-silence check."""
    hops = samples.shape[0] // HOP_LENGTH
    blocks = np.abs(np.asarray(samples[: hops * HOP_LENGTH], dtype=np.float32)).reshape(hops, HOP_LENGTH)
    return blocks.max(axis=1) if hops else np.zeros(0, dtype=np.float32)


def _digital_silence(frame_peaks, seek: int, size: int) -> bool:
    if frame_peaks is None:
        return False
    window = frame_peaks[seek : seek + size]
    return bool(window.size == 0 or window.max() < DIGITAL_SILENCE_PEAK)


def generate_segments(
    runner: WindowRunner,
    tokenizer: WhisperTokenizer,
    features: torch.Tensor,
    sot_sequence: List[int],
    options: TranscribeOptions,
    on_progress: Optional[Callable[[float], None]] = None,
    frame_peaks=None,
) -> Iterator[Segment]:
    """Yield segments window by window for one audio's features [n_mels, frames].

    ``frame_peaks`` (from ``frame_peak_amplitudes``) lets windows of digital silence be skipped
    without decoding; without it every window is decoded, exactly as faster-whisper does.
    """
    content_frames = features.shape[-1] - 1
    suppress = tokenizer.suppressed_tokens(options.suppress_tokens) if options.suppress_tokens else ()
    suppress_at_begin = [tokenizer.encode(" ")[0], tokenizer.eot] if options.suppress_blank else []

    all_tokens: List[int] = []
    if options.initial_prompt is not None:
        if isinstance(options.initial_prompt, str):
            all_tokens.extend(tokenizer.encode(" " + options.initial_prompt.strip()))
        else:
            all_tokens.extend(int(t) for t in options.initial_prompt)
    prompt_reset_since = 0
    clips = seek_clips(options.clip_timestamps, content_frames)
    clip_index = 0
    seek = clips[0][0]
    last_speech_timestamp = 0.0
    segment_id = 0
    if hasattr(runner, "seed"):
        runner.seed(options.seed)  # one generator for the whole audio: a seed gives the same output
    # faster-whisper's flattened loop over (clip start, clip end) frame ranges.
    while clip_index < len(clips):
        clip_start, clip_end = clips[clip_index]
        clip_end = min(clip_end, content_frames)
        if seek < clip_start:
            seek = clip_start
        if seek >= clip_end:
            clip_index += 1
            if clip_index < len(clips):
                seek = clips[clip_index][0]
            continue
        time_offset = seek * FRAME_SECONDS
        segment_size = min(N_FRAMES, content_frames - seek, clip_end - seek)
        segment_duration = segment_size * FRAME_SECONDS
        if _digital_silence(frame_peaks, seek, segment_size):
            seek += segment_size
            if on_progress:
                on_progress(min(content_frames, seek) * FRAME_SECONDS)
            continue
        audio_features = runner.encode(pad_window(features, seek, segment_size)[None])

        prompt = build_prompt(
            tokenizer, all_tokens[prompt_reset_since:], sot_sequence, options.without_timestamps,
            prefix=options.prefix if seek == 0 else None, hotwords=options.hotwords,
        )
        outcome = generate_with_fallback(
            runner, tokenizer, audio_features, prompt, options, suppress, suppress_at_begin
        )
        result, avg_logprob, temperature = outcome.result, outcome.avg_logprob, outcome.temperature
        tokens = result.tokens
        ratio = outcome.compression_ratio

        if options.no_speech_threshold is not None:
            should_skip = result.no_speech_prob > options.no_speech_threshold
            if options.log_prob_threshold is not None and avg_logprob > options.log_prob_threshold:
                should_skip = False  # confident text despite a high no-speech probability
            if should_skip:
                seek += segment_size
                if on_progress:
                    on_progress(min(content_frames, seek) * FRAME_SECONDS)
                continue

        previous_seek = seek
        pieces, seek, single_timestamp_ending = split_by_timestamps(
            tokens, tokenizer.timestamp_begin, time_offset, segment_size, segment_duration, seek
        )
        if options.word_timestamps:
            pieces, seek, last_speech_timestamp, skip_window = _add_words(
                runner, tokenizer, audio_features, sot_sequence, pieces, options,
                seek=seek, previous_seek=previous_seek, segment_size=segment_size,
                single_timestamp_ending=single_timestamp_ending,
                last_speech_timestamp=last_speech_timestamp, content_frames=content_frames,
            )
            if skip_window:  # silence before a likely hallucination: decode again after it
                if on_progress:
                    on_progress(min(content_frames, seek) * FRAME_SECONDS)
                continue
        for piece in pieces:
            piece_text = tokenizer.decode(piece.tokens)
            if piece.start == piece.end or not piece_text.strip():
                continue
            all_tokens.extend(piece.tokens)
            segment_id += 1
            yield Segment(
                id=segment_id,
                seek=previous_seek,
                start=piece.start,
                end=piece.end,
                text=piece_text,
                tokens=piece.tokens,
                avg_logprob=avg_logprob,
                compression_ratio=ratio,
                no_speech_prob=result.no_speech_prob,
                words=_words(piece) if options.word_timestamps else None,
                temperature=temperature,
            )
        if not options.condition_on_previous_text or temperature > options.prompt_reset_on_temperature:
            prompt_reset_since = len(all_tokens)
        if on_progress:
            on_progress(min(content_frames, seek) * FRAME_SECONDS)


def _words(piece) -> List[Word]:
    return [Word(float(w["start"]), float(w["end"]), w["word"], float(w["probability"])) for w in piece.words or []]


def _add_words(
    runner: WindowRunner,
    tokenizer: WhisperTokenizer,
    audio_features: torch.Tensor,
    sot_sequence: List[int],
    pieces: list,
    options: TranscribeOptions,
    *,
    seek: int,
    previous_seek: int,
    segment_size: int,
    single_timestamp_ending: bool,
    last_speech_timestamp: float,
    content_frames: int,
):
    """faster-whisper's word-timestamp step for one window.

    Gives each piece its words (adjusting its start/end), moves ``seek`` to the last word's end
    when the window did not end on a single timestamp, and with ``hallucination_silence_threshold``
    drops likely hallucinations surrounded by silence. Returns (pieces, seek,
    last_speech_timestamp, skip_window); ``skip_window`` means the window's text is dropped and
    decoding resumes at ``seek``.
    """
    time_offset = previous_seek * FRAME_SECONDS
    segment_duration = segment_size * FRAME_SECONDS

    def aligner(text_tokens: List[List[int]]) -> List[TokenAlignment]:
        return runner.align(audio_features, sot_sequence, text_tokens, segment_size)

    add_word_timestamps(
        [pieces], tokenizer, aligner, options.prepend_punctuations, options.append_punctuations,
        last_speech_timestamp, options.language,
    )
    if not single_timestamp_ending:
        end = last_word_end(pieces)
        if end is not None and end > time_offset:
            seek = round(end * FRAMES_PER_SECOND)

    threshold = options.hallucination_silence_threshold
    if threshold is not None:
        # A possible hallucination first in the window: skip the silence before it.
        first = next_words_segment(pieces)
        if first is not None and is_segment_anomaly(first):
            gap = first.start - time_offset
            if gap > threshold:
                return pieces, previous_seek + round(gap * FRAMES_PER_SECOND), last_speech_timestamp, True

        # A possible hallucination with silence (or more hallucinations) on both sides: drop it
        # and everything after it, and resume decoding at its start.
        window_end_time = (previous_seek + N_FRAMES) * FRAME_SECONDS
        content_duration = content_frames * FRAME_SECONDS
        hal_last_end = last_speech_timestamp
        for index, segment in enumerate(pieces):
            if not segment.words:
                continue
            if is_segment_anomaly(segment):
                following = next_words_segment(pieces[index + 1 :])
                if following is not None:
                    hal_next_start = following.words[0]["start"]
                else:
                    hal_next_start = time_offset + segment_duration
                silence_before = (
                    segment.start - hal_last_end > threshold
                    or segment.start < threshold
                    or segment.start - time_offset < 2.0
                )
                silence_after = (
                    hal_next_start - segment.end > threshold
                    or is_segment_anomaly(following)
                    or window_end_time - segment.end < 2.0
                )
                if silence_before and silence_after:
                    seek = round(max(time_offset + 1, segment.start) * FRAMES_PER_SECOND)
                    if content_duration - segment.end < threshold:
                        seek = content_frames
                    pieces = pieces[:index]
                    break
            hal_last_end = segment.end

    end = last_word_end(pieces)
    if end is not None:
        last_speech_timestamp = end
    return pieces, seek, last_speech_timestamp, False
