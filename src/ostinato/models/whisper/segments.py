"""Turning a window's tokens into timed segments, and the seek position that follows (Whisper's rules)."""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ...audio.features import FRAMES_PER_SECOND

WINDOW_SECONDS = 30  # Whisper's input window
TIME_PRECISION = 0.02  # seconds per timestamp token
INPUT_STRIDE = 2  # mel frames per encoder frame
FRAME_SECONDS = 1.0 / FRAMES_PER_SECOND


@dataclass
class RawSegment:
    seek: int
    start: float
    end: float
    tokens: List[int]
    words: Optional[List[dict]] = None  # set by word_timestamps.add_word_timestamps


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def split_by_timestamps(
    tokens: List[int],
    timestamp_begin: int,
    time_offset: float,
    segment_size: int,
    segment_duration: float,
    seek: int,
) -> Tuple[List[RawSegment], int, bool]:
    """Split a window's tokens at consecutive timestamp pairs.

    Returns the segments, the next seek (in mel frames) and whether the window ended on a single
    timestamp (then nothing more was said in it, and the whole window is consumed).
    """
    single_timestamp_ending = len(tokens) >= 2 and tokens[-2] < timestamp_begin <= tokens[-1]
    pair_ends = [
        i for i in range(1, len(tokens)) if tokens[i] >= timestamp_begin and tokens[i - 1] >= timestamp_begin
    ]
    segments: List[RawSegment] = []
    if pair_ends:
        cuts = pair_ends + ([len(tokens)] if single_timestamp_ending else [])
        begin = 0
        for cut in cuts:
            piece = tokens[begin:cut]
            start = time_offset + (piece[0] - timestamp_begin) * TIME_PRECISION
            end = time_offset + (piece[-1] - timestamp_begin) * TIME_PRECISION
            segments.append(RawSegment(seek, start, end, piece))
            begin = cut
        if single_timestamp_ending:
            next_seek = seek + segment_size
        else:
            # The last segment is unfinished: resume decoding from its opening timestamp.
            next_seek = seek + (tokens[begin - 1] - timestamp_begin) * INPUT_STRIDE
    else:
        duration = segment_duration
        stamps = [t for t in tokens if t >= timestamp_begin]
        if stamps and stamps[-1] != timestamp_begin:
            duration = (stamps[-1] - timestamp_begin) * TIME_PRECISION
        segments.append(RawSegment(seek, time_offset, time_offset + duration, list(tokens)))
        next_seek = seek + segment_size
    return segments, next_seek, single_timestamp_ending
