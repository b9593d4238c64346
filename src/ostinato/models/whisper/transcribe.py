"""The window loop: 30-s windows with timestamp-based seeking, prompts from earlier text, no-speech skips.

It follows faster-whisper's sequential transcription (without VAD) so that the same options give
the same tokens; the model work (encoding, decoding a window) is delegated to a ``WindowRunner``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ...errors import InvalidOptionError
from .decoding import WindowRequest, WindowResult
from .segments import FRAME_SECONDS, TIME_PRECISION, compression_ratio, split_by_timestamps
from .tokenizer import WhisperTokenizer
from .types import Segment

N_FRAMES = 3000  # mel frames in a 30-s window
MAX_TEXT_TOKENS = 448


@dataclass
class TranscribeOptions:
    language: Optional[str] = None
    task: str = "transcribe"
    beam_size: int = 1
    temperature: Union[float, Sequence[float]] = 0.0
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

    def validate(self) -> None:
        if self.task not in ("transcribe", "translate"):
            raise InvalidOptionError(f"unknown task {self.task!r}: use 'transcribe' or 'translate'")
        if not isinstance(self.beam_size, int) or self.beam_size < 1:
            raise InvalidOptionError(f"beam_size must be a positive integer, got {self.beam_size!r}")
        if self.beam_size != 1:
            raise InvalidOptionError("beam search is not available yet: use beam_size=1 (greedy)")
        temps = self.temperatures
        if not temps:
            raise InvalidOptionError("temperature must be a number or a non-empty list of numbers")
        if any(t < 0 for t in temps):
            raise InvalidOptionError(f"temperatures must be >= 0, got {list(temps)}")
        if any(t > 0 for t in temps):
            raise InvalidOptionError("sampling (temperature > 0) is not available yet: use temperature=0.0")
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise InvalidOptionError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.max_initial_timestamp < 0:
            raise InvalidOptionError("max_initial_timestamp must be >= 0")
        if self.no_speech_threshold is not None and not 0.0 <= self.no_speech_threshold <= 1.0:
            raise InvalidOptionError("no_speech_threshold must lie between 0 and 1")

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
               suppress: Sequence[int], suppress_at_begin: Sequence[int]) -> List[WindowResult]: ...


def pad_window(features: torch.Tensor, seek: int, size: int) -> torch.Tensor:
    """The mel frames [seek, seek + size) padded with zeros to a full window, as Whisper does."""
    window = features[:, seek : seek + size]
    return F.pad(window, (0, N_FRAMES - window.shape[-1]))


def build_prompt(
    tokenizer: WhisperTokenizer, previous: List[int], sot_sequence: List[int], without_timestamps: bool
) -> List[int]:
    prompt: List[int] = []
    if previous:
        prompt.append(tokenizer.sot_prev)
        prompt.extend(previous[-(MAX_TEXT_TOKENS // 2 - 1):])
    prompt.extend(sot_sequence)
    if without_timestamps:
        prompt.append(tokenizer.no_timestamps)
    return prompt


def generate_segments(
    runner: WindowRunner,
    tokenizer: WhisperTokenizer,
    features: torch.Tensor,
    sot_sequence: List[int],
    options: TranscribeOptions,
    on_progress: Optional[Callable[[float], None]] = None,
) -> Iterator[Segment]:
    """Yield segments window by window for one audio's features [n_mels, frames]."""
    content_frames = features.shape[-1] - 1
    suppress = tokenizer.suppressed_tokens(options.suppress_tokens) if options.suppress_tokens else ()
    suppress_at_begin = [tokenizer.encode(" ")[0], tokenizer.eot] if options.suppress_blank else []
    max_initial_index = int(round(options.max_initial_timestamp / TIME_PRECISION))

    all_tokens: List[int] = []
    if options.initial_prompt is not None:
        if isinstance(options.initial_prompt, str):
            all_tokens.extend(tokenizer.encode(" " + options.initial_prompt.strip()))
        else:
            all_tokens.extend(int(t) for t in options.initial_prompt)
    prompt_reset_since = 0
    seek = 0
    segment_id = 0
    while seek < content_frames:
        time_offset = seek * FRAME_SECONDS
        segment_size = min(N_FRAMES, content_frames - seek)
        segment_duration = segment_size * FRAME_SECONDS
        audio_features = runner.encode(pad_window(features, seek, segment_size)[None])

        prompt = build_prompt(tokenizer, all_tokens[prompt_reset_since:], sot_sequence, options.without_timestamps)
        if options.max_new_tokens is not None:
            max_length = len(prompt) + options.max_new_tokens
            if max_length > MAX_TEXT_TOKENS:
                raise InvalidOptionError(
                    f"prompt ({len(prompt)} tokens) plus max_new_tokens ({options.max_new_tokens}) "
                    f"exceeds Whisper's {MAX_TEXT_TOKENS}-token context"
                )
        else:
            max_length = MAX_TEXT_TOKENS
        # As CTranslate2: at most half the context is generated, and never past its end.
        start_step = len(prompt) - 1
        request = WindowRequest(
            prompt=prompt,
            timestamps=not options.without_timestamps,
            max_initial_timestamp_index=max_initial_index,
            max_new_tokens=min(max_length // 2, max_length - start_step),
        )
        temperature = options.temperatures[0]
        result = runner.decode(audio_features, [request], suppress, suppress_at_begin)[0]
        tokens = result.tokens
        avg_logprob = result.sum_logprob / (len(tokens) + 1)
        text = tokenizer.decode(tokens).strip()
        ratio = compression_ratio(text)

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
        pieces, seek, _ = split_by_timestamps(
            tokens, tokenizer.timestamp_begin, time_offset, segment_size, segment_duration, seek
        )
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
                words=None,
                temperature=temperature,
            )
        if not options.condition_on_previous_text or temperature > options.prompt_reset_on_temperature:
            prompt_reset_since = len(all_tokens)
        if on_progress:
            on_progress(min(content_frames, seek) * FRAME_SECONDS)
