"""What a decode call asks for and gives back, and the arithmetic both searches share.

A window is decoded from a ``WindowRequest`` (its prompt and limits) under ``SearchOptions`` (how
tokens are picked, the same for every window of a run) into a ``WindowResult``. The helpers follow
CTranslate2 (what faster-whisper runs): where the forced prefix starts, the step budget, the
length-normalised score, and the counter-based hash that makes sampling noise a function of a
row's own seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np

if TYPE_CHECKING:  # annotations only: the options module imports this one and stays free of torch
    from torch import Tensor


@dataclass
class WindowRequest:
    prompt: List[int]  # full prompt: previous text, SOT sequence, optional <|notimestamps|>, forced prefix
    timestamps: bool
    max_initial_timestamp_index: int
    max_new_tokens: int  # decoding steps from the start token on: forced prefix and end-of-text included
    rng_seed: Optional[int] = None  # sampling seed of this window (None: the decoder's seed and call count)


@dataclass
class WindowResult:
    tokens: List[int]  # forced prefix and generated tokens, end-of-text removed
    sum_logprob: float  # includes the end-of-text token's log-probability when it was produced
    no_speech_prob: float
    score: Optional[float] = None  # CTranslate2's score: sum_logprob / len(tokens) ** length_penalty


@dataclass(frozen=True)
class SearchOptions:
    """How one decoder call picks tokens; the same for every window of the call."""

    beam_size: int = 1
    patience: float = 1.0
    length_penalty: float = 1.0
    temperature: float = 0.0  # > 0: sample (beam_size must be 1)
    num_hypotheses: int = 1  # independent samples per window when sampling (best_of)
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @property
    def max_candidates(self) -> int:
        """Finished hypotheses a beam search collects before it stops: round(beam_size * patience)."""
        return max_candidates(self.beam_size, self.patience)


def max_candidates(beam_size: int, patience: float) -> int:
    # CTranslate2 rounds the float product half away from zero (std::round).
    return int(math.floor(float(np.float32(beam_size) * np.float32(patience)) + 0.5))


def prompt_length(prompt: Sequence[int], sot: int, no_timestamps: int) -> int:
    """Tokens up to the end of the start-of-transcript sequence, as CTranslate2 counts them.

    That is <|startoftranscript|> and the task tokens after it (language, task,
    <|notimestamps|>); whatever follows is a prefix the decoder is forced through.
    """
    try:
        index = list(prompt).index(sot)
    except ValueError:
        raise ValueError("the prompt has no <|startoftranscript|> token") from None
    while index < len(prompt) and sot <= prompt[index] <= no_timestamps:
        index += 1
    return index


def decode_budget(prompt: Sequence[int], sot: int, no_timestamps: int, max_length: int) -> int:
    """CTranslate2's step limit for a window: at most half the context, and never past its end."""
    start_step = prompt_length(prompt, sot, no_timestamps) - 1
    return min(max_length // 2, max_length - start_step)


def normalized_score(sum_logprob: float, length: int, length_penalty: float) -> float:
    """A hypothesis' final score as CTranslate2 computes it (float32): sum / length ** penalty."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        denominator = np.power(np.float32(length), np.float32(length_penalty))
        return float(np.float32(sum_logprob) / denominator)


def pick_best(scores: Sequence[float]) -> int:
    """Index of the highest score, the earliest on ties; NaN scores rank last."""
    return max(range(len(scores)), key=lambda i: (not math.isnan(scores[i]), scores[i], -i))


MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays inside int64, so the hash is the same
# in Python and in torch on every device (no reliance on integer overflow).
_MIX1, _MIX2 = 0x7FEB352D, 0x68E31DA5


def mix32(x):
    """A 32-bit integer hash (xorshift-multiply rounds) of Python ints or int64 tensors in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MIX1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MIX2) & MASK32
    return x ^ (x >> 16)


def window_seed(seed: int, call: int) -> int:
    """The sampling seed of a transcription's ``call``-th decode, from its 64-bit ``seed``."""
    return mix32(mix32(mix32(seed & MASK32) ^ ((seed >> 32) & MASK32)) ^ (call & MASK32))


def row_seed(window: int, hypothesis: int) -> int:
    return mix32(window ^ mix32(hypothesis + 1))


@dataclass
class WindowJob:
    """One window as a run admits it: its encoder output [1, n_audio_ctx, d] and its request."""

    audio_features: Tensor
    request: WindowRequest


def with_seed(request: WindowRequest, seed: int) -> WindowRequest:
    return replace(request, rng_seed=seed)


def window_jobs(audio_features: Tensor, requests: Sequence[WindowRequest]) -> List[WindowJob]:
    """One job per request from a batch of encoder outputs [B, n_audio_ctx, d] (views, no copies)."""
    return [WindowJob(audio_features[i : i + 1], r) for i, r in enumerate(requests)]
