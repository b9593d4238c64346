"""Batched transcription of one recording: faster-whisper 1.2.1's ``BatchedInferencePipeline``.

The recording is cut where the VAD finds silence (spans of at most 30 s, joined into chunks of
at most 30 s), and the chunks are decoded ``batch_size`` at a time as independent windows: no
prompt from earlier text, one decode each at the first temperature (no fallback, no no-speech
skip), ``without_timestamps`` by default, so one segment per chunk. Times are the chunk's place
in the speech-only audio mapped back to the recording's (``restore_times``).

The model work goes through a runner, as in the window loop: ``features``, ``encode`` (a batch
of windows), ``decode`` (several windows in one call), ``align``, ``detect_language`` and
``speech_probabilities``. ``WhisperModel.transcribe(batched=True)`` runs it on the calling
thread; the transcription engine runs it in an audio's worker, where the chunks of many audios
share the decoder's rows.

What faster-whisper's batched pipeline ignores is ignored here too: ``condition_on_previous_text``,
``prefix``, ``max_initial_timestamp`` (CTranslate2's default index, 50 = 1 s, applies),
``best_of``, the temperatures after the first (and the first is not sampled: CTranslate2 keeps
the best token whatever the temperature when it is not told to sample; it is only reported),
the compression-ratio, log-probability and no-speech thresholds, ``hallucination_silence_threshold``,
``prompt_reset_on_temperature`` and ``seed``. Its ``initial_prompt`` prompts every chunk, encoded
as given (without the leading space the window loop adds).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ...audio.decode import SAMPLE_RATE
from ...audio.vad import Chunk, Span, TimestampMap, collect_chunks, restore_times, speech_spans, vad_options
from ...errors import InvalidOptionError
from ...results import Segment, TranscriptionInfo, Word
from .options import TranscribeOptions, parse_clip_timestamps
from .search import SearchOptions, WindowRequest, decode_budget
from .segments import FRAMES_PER_SECOND, WINDOW_SECONDS, compression_ratio, split_by_timestamps
from .tokenizer import WhisperTokenizer
from .transcribe import N_FRAMES, avg_logprob_of, build_prompt, window_max_length
from .word_timestamps import add_word_timestamps

DEFAULT_BATCH_SIZE = 8  # faster-whisper's BatchedInferencePipeline.transcribe default
CHUNK_SECONDS = WINDOW_SECONDS  # the longest chunk: one window
# CTranslate2's default first-timestamp limit: the batched pipeline does not pass its own.
MAX_INITIAL_TIMESTAMP_INDEX = 50
DETECTION_PAD = -1.5  # the log-mel frame faster-whisper appends before detecting the language


def batched_vad_options(value):
    """The VAD options of the batched pipeline: spans of at most one window, and 160-ms silences
    unless ``vad_parameters`` say otherwise; a dict's ``max_speech_duration_s`` is replaced by the
    window length, a ``VadOptions`` is taken as it is (faster-whisper's rules)."""
    if value is None:
        return vad_options(None, max_speech_duration_s=CHUNK_SECONDS, min_silence_duration_ms=160)
    if isinstance(value, dict):
        given = {k: v for k, v in value.items() if k != "max_speech_duration_s"}
        return vad_options(given, max_speech_duration_s=CHUNK_SECONDS)
    return vad_options(value)


def plan_chunks(runner, samples: np.ndarray, options: TranscribeOptions):
    """(chunks, spans, vad) of one recording: what is decoded, the speech spans whose silences are
    added back to the times (None with ``clip_timestamps``: their times are the recording's),
    and the VAD options that ran (None when it did not)."""
    n = samples.shape[0]
    duration = n / SAMPLE_RATE
    if not (isinstance(options.clip_timestamps, str) and options.clip_timestamps == "0"):
        points = parse_clip_timestamps(options.clip_timestamps)
        if len(points) % 2:
            points.append(duration)
        chunks = []
        for start, end in zip(points[::2], points[1::2]):
            first, last = int(start * SAMPLE_RATE), int(end * SAMPLE_RATE)
            chunks.append(Chunk(samples[first:last], first / SAMPLE_RATE, (last - first) / SAMPLE_RATE))
        return chunks, None, None
    vad = None
    if options.vad_filter:
        vad = batched_vad_options(options.vad_parameters)
        spans = speech_spans(runner.speech_probabilities(samples), n, vad)
    elif duration < CHUNK_SECONDS:
        spans = [Span(0, n)]
    else:
        raise InvalidOptionError(
            f"batched transcription cuts the audio at the silences the VAD finds: audio longer than "
            f"{CHUNK_SECONDS} s needs vad_filter=True or clip_timestamps"
        )
    return collect_chunks(samples, spans, CHUNK_SECONDS), spans, vad


def _chunk_features(runner, chunk: Chunk) -> torch.Tensor:
    # faster-whisper drops each chunk's last frame (the one its padding hop adds).
    return runner.features(chunk.audio)[..., :-1]


def _window(features: torch.Tensor) -> torch.Tensor:
    """pad_or_trim: exactly one window of frames."""
    window = features[:, :N_FRAMES]
    return F.pad(window, (0, N_FRAMES - window.shape[-1]))


def _detect_language(runner, chunks: Sequence[Chunk], n_mels: int):
    """faster-whisper's detection on the chunks' features joined (and one padding frame), first window."""
    parts, frames = [], 0
    for chunk in chunks:
        if frames >= N_FRAMES:
            break
        part = _chunk_features(runner, chunk)
        parts.append(part)
        frames += part.shape[-1]
    if frames < N_FRAMES:
        device = parts[0].device if parts else None
        parts.append(torch.full((n_mels, 1), DETECTION_PAD, dtype=torch.float32, device=device))
    joined = torch.cat(parts, dim=-1)
    probs = runner.detect_language(runner.encode(_window(joined)[None]))
    language, probability = probs[0]
    return language, probability, probs


def transcribe_batched(
    runner,
    tokenizer: WhisperTokenizer,
    dims,
    samples: np.ndarray,
    options: TranscribeOptions,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_progress: Optional[Callable[[float], None]] = None,
) -> Tuple[Iterator[Segment], TranscriptionInfo]:
    """(segments generator, info) of one recording, its chunks decoded ``batch_size`` at a time.

    The VAD (or the clips), and the language detection when no language is given, run here; the
    chunks are encoded, decoded and aligned as the generator is consumed.
    """
    duration = samples.shape[0] / SAMPLE_RATE
    chunks, spans, vad = plan_chunks(runner, samples, options)
    if spans is not None:
        kept = sum(end - start for start, end in spans)
    else:
        kept = sum(c.audio.shape[0] for c in chunks)
    duration_after_vad = kept / SAMPLE_RATE
    if not kept:
        chunks = []  # nothing to decode (faster-whisper computes no features then)

    language = options.language
    all_language_probs = None
    language_probability = 1.0
    if language is None:
        if dims.is_multilingual:
            language, language_probability, all_language_probs = _detect_language(runner, chunks, dims.n_mels)
        else:
            language = "en"
    options.language = language
    sot_sequence = tokenizer.sot_sequence(language, options.task)

    if options.initial_prompt is None:
        previous: List[int] = []
    elif isinstance(options.initial_prompt, str):
        previous = tokenizer.encode(options.initial_prompt)
    else:
        previous = [int(t) for t in options.initial_prompt]
    prompt = build_prompt(tokenizer, previous, sot_sequence, options.without_timestamps, hotwords=options.hotwords)
    max_length = window_max_length(prompt, options)
    request = WindowRequest(
        prompt=prompt,
        timestamps=not options.without_timestamps,
        max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
        max_new_tokens=decode_budget(prompt, tokenizer.sot, tokenizer.no_timestamps, max_length),
    )

    info = TranscriptionInfo(
        language=language,
        language_probability=language_probability,
        duration=duration,
        all_language_probs=all_language_probs,
        transcription_options=options.to_dict(),
        duration_after_vad=duration_after_vad,
        vad_options=vad.to_dict() if vad is not None else None,
    )
    segments = _segments(runner, tokenizer, chunks, sot_sequence, request, options, batch_size, on_progress, spans)
    if spans:
        segments = restore_times(segments, spans)
    return segments, info


def _segments(runner, tokenizer, chunks, sot_sequence, request, options, batch_size, on_progress, spans):
    search = SearchOptions(
        beam_size=options.beam_size,
        patience=float(options.patience),
        length_penalty=float(options.length_penalty),
        repetition_penalty=float(options.repetition_penalty),
        no_repeat_ngram_size=int(options.no_repeat_ngram_size),
    )
    suppress = tokenizer.suppressed_tokens(options.suppress_tokens) if options.suppress_tokens else ()
    suppress_at_begin = [tokenizer.encode(" ")[0], tokenizer.eot] if options.suppress_blank else []
    temperature = options.temperatures[0]
    times = TimestampMap(spans) if spans else None
    last_speech_timestamp = 0.0
    segment_id = 0
    for first in range(0, len(chunks), batch_size):
        group = chunks[first : first + batch_size]
        mels = torch.stack([_window(_chunk_features(runner, chunk)) for chunk in group])
        audio_features = runner.encode(mels)
        results = runner.decode(audio_features, [request] * len(group), suppress, suppress_at_begin, search)
        windows, sizes = [], []
        for chunk, result in zip(group, results):
            size = int(math.ceil(chunk.duration) * FRAMES_PER_SECOND)
            pieces, _, _ = split_by_timestamps(
                result.tokens, tokenizer.timestamp_begin, chunk.offset, size, chunk.duration, 0
            )
            for piece in pieces:
                piece.seek = int(chunk.offset * FRAMES_PER_SECOND)
            windows.append(pieces)
            sizes.append(size)
        if options.word_timestamps:
            def aligner(text_tokens: List[List[int]]):
                return [
                    runner.align(audio_features[i : i + 1], sot_sequence, [tokens], sizes[i])[0]
                    for i, tokens in enumerate(text_tokens)
                ]

            last_speech_timestamp = add_word_timestamps(
                windows, tokenizer, aligner, options.prepend_punctuations, options.append_punctuations,
                last_speech_timestamp, options.language,
            )
        for result, pieces in zip(results, windows):
            avg_logprob = avg_logprob_of(result, options.length_penalty)
            for piece in pieces:
                text = tokenizer.decode(piece.tokens)
                segment_id += 1
                yield Segment(
                    id=segment_id,
                    seek=piece.seek,
                    start=round(piece.start, 3),
                    end=round(piece.end, 3),
                    text=text,
                    tokens=piece.tokens,
                    avg_logprob=avg_logprob,
                    compression_ratio=compression_ratio(text),
                    no_speech_prob=result.no_speech_prob,
                    words=[Word(float(w["start"]), float(w["end"]), w["word"], float(w["probability"]))
                           for w in piece.words or []] if options.word_timestamps else None,
                    temperature=temperature,
                )
        if on_progress:
            last = group[-1]
            end = last.offset + last.duration
            on_progress(times.original_time(end, is_end=True) if times else end)
