"""Word-level timestamps from cross-attention, computed as faster-whisper does.

For each 30-s window the decoder is run once more over ``[sot sequence, <|notimestamps|>, text
tokens, <|endoftext|>]``. The pre-softmax cross-attention scores of the model's alignment heads,
cut to the window's real encoder frames, go through a softmax over frames, a normalisation over
tokens, a median filter over frames and a mean over heads; dynamic time warping of the negated
result gives each token's first frame. Tokens are grouped into words, punctuation is merged into
its neighbours, and faster-whisper's clean-up rules (long words at sentence and segment
boundaries, segment start/end preference) are applied.

The attention work runs on the model's device (``align_tokens``); the DTW over the small
[tokens x frames] matrix runs on the CPU in numpy, one anti-diagonal at a time, with the same
float32 arithmetic and tie-breaking as CTranslate2's ``negative_dtw``.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .options import DEFAULT_APPEND_PUNCTUATIONS, DEFAULT_PREPEND_PUNCTUATIONS
from .segments import FRAMES_PER_SECOND, INPUT_STRIDE
from .tokenizer import WhisperTokenizer

TOKENS_PER_SECOND = FRAMES_PER_SECOND // INPUT_STRIDE  # encoder frames per second
MEDIAN_FILTER_WIDTH = 7
SENTENCE_END_MARKS = ".。!！?？"
# Languages written without spaces: words are split wherever the text decodes to whole characters.
UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}
# Punctuation that hallucination checks ignore (faster-whisper's list, both sets joined).
_ANOMALY_PUNCTUATION = DEFAULT_PREPEND_PUNCTUATIONS + DEFAULT_APPEND_PUNCTUATIONS


def default_alignment_heads(n_layer: int, n_head: int) -> List[Tuple[int, int]]:
    """openai-whisper's fallback: every head of the last half of the decoder layers."""
    return [(layer, head) for layer in range(n_layer // 2, n_layer) for head in range(n_head)]


# -- numerics ------------------------------------------------------------------------------------

def median_filter(x: Tensor, width: int) -> Tensor:
    """Median over a sliding window of odd ``width`` along the last dimension.

    Edges are mirrored without repeating the edge value (``reflect``), as CTranslate2 and
    openai-whisper do; an axis no longer than ``width // 2`` is returned unchanged.
    """
    if width <= 0 or width % 2 == 0:
        raise ValueError(f"median filter width must be a positive odd number, got {width}")
    pad = width // 2
    if x.shape[-1] <= pad or pad == 0:
        return x
    shape, length = x.shape, x.shape[-1]
    padded = F.pad(x.reshape(-1, 1, length), (pad, pad), mode="reflect")[:, 0]
    # Sort the `width` shifted copies elementwise (odd-even transposition network: min/max
    # only, several times faster than sorting unfolded windows); the middle one is the median.
    lanes = [padded[:, k : k + length] for k in range(width)]
    for round_ in range(width):
        for a in range(round_ % 2, width - 1, 2):
            lo, hi = torch.minimum(lanes[a], lanes[a + 1]), torch.maximum(lanes[a], lanes[a + 1])
            lanes[a], lanes[a + 1] = lo, hi
    return lanes[pad].reshape(shape)


def normalize_over_tokens(x: Tensor) -> Tensor:
    """(x - mean) / std along the token axis (dim -2), population variance, no epsilon.

    The variance is E[x^2] - mean^2 clamped at 0, in float32, as CTranslate2 computes it.
    """
    n = x.shape[-2]
    mean = x.sum(dim=-2, keepdim=True) / n
    var = ((x * x).sum(dim=-2, keepdim=True) / n - mean * mean).clamp_min(0.0)
    return (x - mean) * (1.0 / torch.sqrt(var))


def dtw(cost: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic path through ``cost`` [N, M] from (0, 0) to (N-1, M-1).

    Returns (row indices, column indices) along the path. Accumulated costs are float32; at
    each cell the diagonal step wins only when strictly cheaper than both others, the vertical
    step only when strictly cheaper than both others, otherwise the horizontal step: the
    tie-breaking of openai-whisper's and CTranslate2's DTW.
    """
    cost = np.asarray(cost, dtype=np.float32)
    n, m = cost.shape
    if n == 0 or m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    inf = np.float32(np.inf)
    # Skewed layout: acc[k, i] is the accumulated cost of cell (i, j = k - i) (1-based, with
    # row/column 0 the boundary), so each anti-diagonal is one contiguous row.
    acc = np.full((n + m + 1, n + 2), inf, dtype=np.float32)
    trace = np.full((n + m + 1, n + 1), -1, dtype=np.int8)
    acc[0, 0] = 0.0
    for k in range(2, n + m + 1):
        lo, hi = max(1, k - m), min(n, k - 1)
        if lo > hi:
            continue
        i = np.arange(lo, hi + 1)
        c0 = acc[k - 2, lo - 1 : hi]  # (i - 1, j - 1)
        c1 = acc[k - 1, lo - 1 : hi]  # (i - 1, j)
        c2 = acc[k - 1, lo : hi + 1]  # (i, j - 1)
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2)).astype(np.int8)
        best = np.where(t == 0, c0, np.where(t == 1, c1, c2))
        acc[k, lo : hi + 1] = cost[i - 1, k - i - 1] + best
        trace[k, lo : hi + 1] = t
    i, j = n, m
    rows: List[int] = []
    cols: List[int] = []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        if i == 0:
            t = 2
        elif j == 0:
            t = 1
        else:
            t = int(trace[i + j, i])
        if t == 0:
            i -= 1
            j -= 1
        elif t == 1:
            i -= 1
        elif t == 2:
            j -= 1
        else:  # pragma: no cover - every interior cell has a trace
            raise RuntimeError(f"DTW trace missing at ({i}, {j})")
    return np.array(rows[::-1], dtype=np.int64), np.array(cols[::-1], dtype=np.int64)


@dataclass
class TokenAlignment:
    """One sequence's alignment: per text token its probability, and the DTW path."""

    text_token_probs: List[float]
    text_indices: np.ndarray  # path rows: 0..len(text) (the last row is <|endoftext|>)
    time_indices: np.ndarray  # path columns: encoder frames


@torch.inference_mode()
def align_tokens(
    decoder,
    audio_features: Tensor,
    sot_sequence: Sequence[int],
    text_tokens: Sequence[Sequence[int]],
    num_frames: int,
    heads: Sequence[Tuple[int, int]],
    eot: int,
    no_timestamps: int,
    median_filter_width: int = MEDIAN_FILTER_WIDTH,
) -> List[TokenAlignment]:
    """Align each text sequence to its window's audio (CTranslate2's ``Whisper.align``).

    ``decoder`` is a ``TextDecoder``; ``audio_features`` the encoder output [B, n_audio_ctx, d]
    with one row per sequence; ``num_frames`` the window's mel frames holding audio. Sequences
    of a batch are padded, but each is normalised over its own rows only (so a batch gives the
    same result as one sequence at a time).
    """
    if len(text_tokens) != audio_features.shape[0]:
        raise ValueError(f"{audio_features.shape[0]} windows of audio but {len(text_tokens)} token sequences")
    if not text_tokens:
        return []
    device = audio_features.device
    offset = len(sot_sequence)
    sequences = [list(sot_sequence) + [no_timestamps] + list(t) + [eot] for t in text_tokens]
    length = max(len(s) for s in sequences)
    # Right padding is harmless: attention is causal, so padded positions never reach real ones.
    tokens = torch.tensor([s + [eot] * (length - len(s)) for s in sequences], device=device)
    cross = decoder.cross_kv(audio_features)
    logits, scores = decoder.forward_with_cross_scores(
        tokens, [k for k, _ in cross], [v for _, v in cross], list(heads)
    )
    # Probabilities over the text vocabulary (ids below <|endoftext|>) of each next text token.
    probs = torch.softmax(logits[:, :, :eot], dim=-1)
    frames = max(1, min(num_frames // 2, scores.shape[-1]))  # the second convolution has stride 2
    weights = torch.softmax(scores[..., :frames].float(), dim=-1)

    results = []
    for b, text in enumerate(text_tokens):
        n = len(sequences[b])
        w = normalize_over_tokens(weights[b, :, :n])
        w = median_filter(w, median_filter_width).mean(dim=0)
        matrix = w[offset : n - 1]  # rows of <|notimestamps|> and the text tokens
        targets = torch.tensor(list(text), dtype=torch.long, device=device)
        token_probs = probs[b, offset : offset + len(text)].gather(1, targets[:, None])[:, 0]
        text_indices, time_indices = dtw(-matrix.cpu().numpy())
        results.append(TokenAlignment(token_probs.cpu().tolist(), text_indices, time_indices))
    return results


# -- words ---------------------------------------------------------------------------------------

def split_tokens_on_unicode(tokenizer: WhisperTokenizer, tokens: List[int]) -> Tuple[List[str], List[List[int]]]:
    """Group tokens into the shortest runs that decode to whole characters."""
    decoded_full = tokenizer.decode_with_timestamps(tokens)
    replacement = "\ufffd"
    words: List[str] = []
    word_tokens: List[List[int]] = []
    current: List[int] = []
    unicode_offset = 0
    for token in tokens:
        current.append(token)
        decoded = tokenizer.decode_with_timestamps(current)
        at = decoded.find(replacement)
        # A replacement character is fine when the full text has one there too.
        if at < 0 or (at + unicode_offset < len(decoded_full) and decoded_full[at + unicode_offset] == replacement):
            words.append(decoded)
            word_tokens.append(current)
            current = []
            unicode_offset += len(decoded)
    return words, word_tokens


def split_tokens_on_spaces(tokenizer: WhisperTokenizer, tokens: List[int]) -> Tuple[List[str], List[List[int]]]:
    """Words start at a leading space, a punctuation mark or a special token."""
    subwords, subword_tokens = split_tokens_on_unicode(tokenizer, tokens)
    words: List[str] = []
    word_tokens: List[List[int]] = []
    for subword, ids in zip(subwords, subword_tokens):
        special = ids[0] >= tokenizer.eot
        with_space = subword.startswith(" ")
        # A substring test, as in Whisper: "" and runs like "()" count as punctuation.
        punctuation = subword.strip() in string.punctuation
        if special or with_space or punctuation or not words:
            words.append(subword)
            word_tokens.append(list(ids))
        else:
            words[-1] = words[-1] + subword
            word_tokens[-1].extend(ids)
    return words, word_tokens


def split_to_word_tokens(
    tokenizer: WhisperTokenizer, tokens: List[int], language: Optional[str]
) -> Tuple[List[str], List[List[int]]]:
    if language in UNSPACED_LANGUAGES:
        return split_tokens_on_unicode(tokenizer, tokens)
    return split_tokens_on_spaces(tokenizer, tokens)


@dataclass
class WordTiming:
    word: str
    tokens: List[int]
    start: float
    end: float
    probability: float


def words_from_alignment(
    tokenizer: WhisperTokenizer, text_tokens: List[int], alignment: TokenAlignment, language: Optional[str]
) -> List[WordTiming]:
    """Word timings (relative to the window start) from one sequence's token alignment."""
    words, word_tokens = split_to_word_tokens(tokenizer, list(text_tokens) + [tokenizer.eot], language)
    if len(word_tokens) <= 1:  # only <|endoftext|>
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    if len(boundaries) <= 1:
        return []
    # A token's time is the first frame of its row on the DTW path.
    jumps = np.pad(np.diff(alignment.text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = alignment.time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[boundaries[:-1]]
    end_times = jump_times[boundaries[1:]]
    probs = alignment.text_token_probs
    return [
        WordTiming(word, tokens, start, end, np.mean(probs[i:j]))
        for word, tokens, start, end, i, j in zip(
            words, word_tokens, start_times, end_times, boundaries[:-1], boundaries[1:]
        )
    ]


def merge_punctuations(alignment: List[WordTiming], prepended: str, appended: str) -> None:
    """Attach opening punctuation to the next word and closing punctuation to the previous one."""
    # Prepended marks (a separate word starting with a space), walking right to left.
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word = ""
            previous.tokens = []
        else:
            j = i
        i -= 1
    # Appended marks, walking left to right.
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word = ""
            following.tokens = []
        else:
            i = j
        j += 1


def add_word_timestamps(
    windows: List[list],
    tokenizer: WhisperTokenizer,
    aligner: Callable[[List[List[int]]], List[TokenAlignment]],
    prepend_punctuations: str,
    append_punctuations: str,
    last_speech_timestamp: float,
    language: Optional[str] = None,
) -> float:
    """Give every segment of every window its ``words`` and adjust its start/end (faster-whisper).

    ``windows`` holds, per window, its segments (objects with ``seek``, ``start``, ``end``,
    ``tokens`` and a writable ``words``). ``aligner`` maps each window's text tokens to a
    ``TokenAlignment``. Returns the end of the last segment that got words.
    """
    if not windows:
        return last_speech_timestamp
    text_tokens: List[List[int]] = []
    per_segment_tokens: List[List[List[int]]] = []
    for window in windows:
        tokens = [[t for t in segment.tokens if t < tokenizer.eot] for segment in window]
        per_segment_tokens.append(tokens)
        text_tokens.append([t for seg in tokens for t in seg])

    alignments: List[List[WordTiming]] = []
    if text_tokens:
        results = aligner(text_tokens)
        alignments = [words_from_alignment(tokenizer, t, r, language) for t, r in zip(text_tokens, results)]

    durations: List[Tuple[float, float]] = []
    for alignment in alignments:
        word_durations = np.array([w.end - w.start for w in alignment])
        word_durations = word_durations[word_durations.nonzero()]
        median_duration = np.median(word_durations) if len(word_durations) > 0 else 0.0
        median_duration = min(0.7, float(median_duration))
        max_duration = median_duration * 2
        # Long words at sentence boundaries are truncated to twice the median word duration.
        if len(word_durations) > 0:
            for i in range(1, len(alignment)):
                if alignment[i].end - alignment[i].start > max_duration:
                    if alignment[i].word in SENTENCE_END_MARKS:
                        alignment[i].end = alignment[i].start + max_duration
                    elif alignment[i - 1].word in SENTENCE_END_MARKS:
                        alignment[i].start = alignment[i].end - max_duration
        merge_punctuations(alignment, prepend_punctuations, append_punctuations)
        durations.append((median_duration, max_duration))

    for w_index, window in enumerate(windows):
        alignment = alignments[w_index]
        median_duration, max_duration = durations[w_index]
        time_offset = window[0].seek / FRAMES_PER_SECOND
        word_index = 0
        for s_index, segment in enumerate(window):
            saved_tokens = 0
            words: List[dict] = []
            n_tokens = len(per_segment_tokens[w_index][s_index])
            while word_index < len(alignment) and saved_tokens < n_tokens:
                timing = alignment[word_index]
                if timing.word:
                    words.append(dict(
                        word=timing.word,
                        start=round(time_offset + timing.start, 2),
                        end=round(time_offset + timing.end, 2),
                        probability=timing.probability,
                    ))
                saved_tokens += len(timing.tokens)
                word_index += 1

            if words:
                # The first (and second) word after a pause may not exceed twice the median duration.
                if words[0]["end"] - last_speech_timestamp > median_duration * 4 and (
                    words[0]["end"] - words[0]["start"] > max_duration
                    or (len(words) > 1 and words[1]["end"] - words[0]["start"] > max_duration * 2)
                ):
                    if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
                        boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
                        words[0]["end"] = words[1]["start"] = boundary
                    words[0]["start"] = max(0, words[0]["end"] - max_duration)

                # Prefer the segment's own start when the first word is too long.
                if segment.start < words[0]["end"] and segment.start - 0.5 > words[0]["start"]:
                    words[0]["start"] = max(0, min(words[0]["end"] - median_duration, segment.start))
                else:
                    segment.start = float(words[0]["start"])

                # Prefer the segment's own end when the last word is too long.
                if segment.end > words[-1]["start"] and segment.end + 0.5 < words[-1]["end"]:
                    words[-1]["end"] = max(words[-1]["start"] + median_duration, segment.end)
                else:
                    segment.end = float(words[-1]["end"])

                last_speech_timestamp = segment.end
            segment.words = words
    return last_speech_timestamp


# -- hallucination checks (used with hallucination_silence_threshold) ---------------------------

def word_anomaly_score(word: dict) -> float:
    """How unlike a real word this is: improbable, very short or very long."""
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment) -> bool:
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w["word"] not in _ANOMALY_PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments) -> Optional[object]:
    return next((s for s in segments if s.words), None)


def last_word_end(segments) -> Optional[float]:
    """The end of the last word of the last segment with words, else the last segment's end."""
    return next(
        (w["end"] for s in reversed(segments) for w in reversed(s.words or [])),
        segments[-1].end if segments else None,
    )
