"""The window loop: 30-s windows with timestamp-based seeking, prompts from earlier text, no-speech skips.

It follows faster-whisper's sequential transcription (without VAD) so that the same options give
the same tokens; the model work (encoding, decoding a window) is delegated to a ``WindowRunner``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ...audio.decode import SAMPLE_RATE
from ...audio.features import HOP_LENGTH
from ...audio.vad import TimestampMap, collect_chunks, restore_times, speech_spans, vad_options
from ...errors import InvalidOptionError
from .options import (  # noqa: F401 - parse_clip_timestamps: part of the window loop's interface
    MAX_TEXT_TOKENS, TranscribeOptions, parse_clip_timestamps,
)
from .search import SearchOptions, WindowRequest, WindowResult, decode_budget
from .segments import (
    FRAME_SECONDS, FRAMES_PER_SECOND, TIME_PRECISION, WINDOW_SECONDS, compression_ratio, split_by_timestamps,
)
from .tokenizer import WhisperTokenizer
from ...results import Segment, TranscriptionInfo, Word
from .word_timestamps import (
    TokenAlignment,
    add_word_timestamps,
    is_segment_anomaly,
    last_word_end,
    next_words_segment,
)

N_FRAMES = WINDOW_SECONDS * FRAMES_PER_SECOND  # mel frames in a window


def seek_clips(clip_timestamps: Union[str, Sequence[float]], content_frames: int) -> List[Tuple[int, int]]:
    """The (start, end) mel-frame ranges to transcribe, as faster-whisper derives them."""
    points = [round(t * FRAMES_PER_SECOND) for t in parse_clip_timestamps(clip_timestamps)]
    if not points:
        points.append(0)
    if len(points) % 2 == 1:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2]))


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


def window_max_length(prompt: Sequence[int], options: TranscribeOptions) -> int:
    """A window's token limit, prompt included: the prompt plus ``max_new_tokens``, or Whisper's
    whole text context; InvalidOptionError when the prompt and ``max_new_tokens`` do not fit."""
    if options.max_new_tokens is None:
        return MAX_TEXT_TOKENS
    max_length = len(prompt) + options.max_new_tokens
    if max_length > MAX_TEXT_TOKENS:
        raise InvalidOptionError(
            f"prompt ({len(prompt)} tokens) plus max_new_tokens ({options.max_new_tokens}) "
            f"exceeds Whisper's {MAX_TEXT_TOKENS}-token context"
        )
    return max_length


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
    max_length = window_max_length(prompt, options)
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


def digital_silence(samples, seek: int, size: int) -> bool:
    """Whether the mel frames ``seek .. seek + size`` (10-ms hops of whole frames) of ``samples`` are
    digital silence. Read per window, when the window loop reaches it: a pass over a whole long
    recording before its first window was on the batch's critical path (a 377-s audio: ~5 ms)."""
    if samples is None:
        return False
    hops = samples.shape[0] // HOP_LENGTH
    window = np.asarray(samples[seek * HOP_LENGTH : min(seek + size, hops) * HOP_LENGTH])
    if window.size == 0:
        return True
    # max and -min instead of abs(): no temporary the window's size
    return bool(max(float(window.max()), -float(window.min())) < DIGITAL_SILENCE_PEAK)


def generate_segments(
    runner: WindowRunner,
    tokenizer: WhisperTokenizer,
    features: torch.Tensor,
    sot_sequence: List[int],
    options: TranscribeOptions,
    on_progress: Optional[Callable[[float], None]] = None,
    samples=None,
) -> Iterator[Segment]:
    """Yield segments window by window for one audio's features [n_mels, frames].

    ``samples`` (the audio the features are of) lets windows of digital silence be skipped without
    decoding; without them every window is decoded, exactly as faster-whisper does.
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
        if digital_silence(samples, seek, segment_size):
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


def transcribe_samples(runner, tokenizer, dims, samples, options: TranscribeOptions, on_progress=None,
                       batch_size: Optional[int] = None):
    """(segments generator, info) of one audio's samples; ``runner`` does the model work.

    ``runner`` is a ``WhisperModel`` or a stand-in with the same ``features``, ``encode``,
    ``detect_language``, ``decode``, ``align``, ``seed`` and ``speech_probabilities`` (the batch
    scheduler's per-audio proxy); ``options`` is this audio's own copy (the detected language is
    written into it). With ``options.batched`` the batched pipeline runs instead (``batched.py``),
    ``batch_size`` chunks at a time.

    With ``vad_filter`` (and no ``clip_timestamps``), as faster-whisper: the window loop runs on
    the speech the VAD finds, joined, and the times are mapped back to the recording's.
    """
    if options.batched:
        from .batched import DEFAULT_BATCH_SIZE, transcribe_batched

        return transcribe_batched(runner, tokenizer, dims, samples, options, batch_size or DEFAULT_BATCH_SIZE,
                                  on_progress)
    duration = samples.shape[0] / SAMPLE_RATE
    spans = vad = None
    if options.runs_vad:
        vad = vad_options(options.vad_parameters)
        spans = speech_spans(runner.speech_probabilities(samples), samples.shape[0], vad)
        samples = collect_chunks(samples, spans)[0].audio
        if spans and on_progress is not None:
            times, report = TimestampMap(spans), on_progress
            on_progress = lambda seconds: report(times.original_time(seconds, is_end=True))  # noqa: E731
    features = runner.features(samples)
    language = options.language
    all_language_probs = None
    if language is None:
        if dims.is_multilingual:
            # As faster-whisper: detect on the window at the first clip's start.
            content_frames = features.shape[-1] - 1
            points = parse_clip_timestamps(options.clip_timestamps)
            start = int(points[0] * 100) if points else 0
            start = start if start < content_frames else 0
            first = runner.encode(pad_window(features, start, min(N_FRAMES, content_frames - start))[None])
            all_language_probs = runner.detect_language(first)
            language, language_probability = all_language_probs[0]
        else:
            language, language_probability = "en", 1.0
    else:
        language_probability = 1.0
    options.language = language
    sot_sequence = tokenizer.sot_sequence(language, options.task)
    info = TranscriptionInfo(
        language=language,
        language_probability=language_probability,
        duration=duration,
        all_language_probs=all_language_probs,
        transcription_options=options.to_dict(),
        duration_after_vad=samples.shape[0] / SAMPLE_RATE,
        vad_options=vad.to_dict() if vad is not None else None,
    )
    segments = generate_segments(
        runner, tokenizer, features, sot_sequence, options, on_progress,
        samples=samples,
    )
    if spans:
        segments = restore_times(segments, spans)
    return segments, info
