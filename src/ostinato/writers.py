"""Transcript writers: txt, vtt, srt, tsv and json files.

Each writer produces byte-for-byte the file openai-whisper's command line writes for the same
segments with its default options, so tools built around those files keep working. The rules
(timestamp rounding, cue layout, text clean-up) are reimplemented here, not imported.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, List, Optional, Sequence, TextIO, Tuple

from .errors import InvalidOptionError

if TYPE_CHECKING:  # only for annotations: writers stay importable without the model stack
    from .models.whisper.types import Segment, TranscriptionInfo

FORMATS = ("txt", "vtt", "srt", "tsv", "json")

# openai-whisper never breaks a line of a word-timed cue before this many characters unless asked
# to, and never splits a segment's words into chunks smaller than this many words.
_MAX_LINE_WIDTH = 1000
_MAX_WORDS_PER_CHUNK = 1000

Cue = Tuple[float, float, str]


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """``[HH:]MM:SS<marker>mmm``; hours appear when asked for or when nonzero.

    Milliseconds are ``round(seconds * 1000)`` with Python's round-half-to-even on the float
    product (so 0.0025 s -> 2 ms, 0.0015 s -> 2 ms): the same integer openai-whisper computes.
    """
    if not seconds >= 0:  # also rejects NaN
        raise ValueError(f"non-negative timestamp expected, got {seconds!r}")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1_000)
    hours_part = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_part}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


class Writer:
    """Writes one transcript format to an open text file."""

    extension: str = ""

    def write(self, segments: Sequence[Segment], info: Optional[TranscriptionInfo], file: TextIO) -> None:
        raise NotImplementedError


class TxtWriter(Writer):
    extension = "txt"

    def write(self, segments, info, file):
        for segment in segments:
            file.write(segment.text.strip() + "\n")


class _SubtitleWriter(Writer):
    always_include_hours = False
    decimal_marker = "."

    def timestamp(self, seconds: float) -> str:
        return format_timestamp(seconds, self.always_include_hours, self.decimal_marker)

    def cues(self, segments: Sequence[Segment]) -> Iterator[Cue]:
        """The (start, end, text) cues of a subtitle file.

        Word-level options (highlighting, line width or count limits) would plug in here by
        regrouping the word timings; with the defaults one segment gives one cue.
        """
        # openai-whisper decides by the first segment alone whether the result carries word timings.
        if segments and segments[0].words is not None:
            yield from _word_timed_cues(segments)
            return
        for segment in segments:
            # "-->" inside the text would read as a cue timing line to subtitle parsers.
            yield segment.start, segment.end, segment.text.strip().replace("-->", "->")


def _word_timed_cues(segments: Sequence[Segment]) -> Iterator[Cue]:
    """Cues from word timings under openai-whisper's default layout.

    Every chunk of a segment's words becomes one cue spanning its first word's start to its last
    word's end. Segments without words give no cue. Unlike segment cues, the text keeps "-->"
    and only the first word of a line is stripped, as openai-whisper does.
    """
    for segment in segments:
        words = segment.words or []
        for first in range(0, len(words), _MAX_WORDS_PER_CHUNK):
            chunk = words[first:first + _MAX_WORDS_PER_CHUNK]
            parts: List[str] = []
            line_len = 0
            for word in chunk:
                if line_len > 0 and line_len + len(word.word) <= _MAX_LINE_WIDTH:
                    parts.append(word.word)
                    line_len += len(word.word)
                else:
                    text = word.word.strip()
                    if line_len > 0:  # an over-long line wraps
                        text = "\n" + text
                    parts.append(text)
                    line_len = len(text.strip())
            yield chunk[0].start, chunk[-1].end, "".join(parts)


class VttWriter(_SubtitleWriter):
    extension = "vtt"

    def write(self, segments, info, file):
        file.write("WEBVTT\n\n")
        for start, end, text in self.cues(segments):
            file.write(f"{self.timestamp(start)} --> {self.timestamp(end)}\n{text}\n\n")


class SrtWriter(_SubtitleWriter):
    extension = "srt"
    always_include_hours = True
    decimal_marker = ","

    def write(self, segments, info, file):
        for number, (start, end, text) in enumerate(self.cues(segments), start=1):
            file.write(f"{number}\n{self.timestamp(start)} --> {self.timestamp(end)}\n{text}\n\n")


class TsvWriter(Writer):
    """Integer milliseconds, so no locale can turn a decimal point into a comma."""

    extension = "tsv"

    def write(self, segments, info, file):
        file.write("start\tend\ttext\n")
        for segment in segments:
            text = segment.text.strip().replace("\t", " ")
            file.write(f"{round(1000 * segment.start)}\t{round(1000 * segment.end)}\t{text}\n")


class JsonWriter(Writer):
    extension = "json"

    def write(self, segments, info, file):
        json.dump(result_dict(segments, info), file)


def _segment_dict(segment: Segment) -> dict:
    # Key order follows openai-whisper's result so the serialized files are identical.
    d = {
        "id": segment.id,
        "seek": segment.seek,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }
    if segment.words is not None:
        d["words"] = [
            {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
            for w in segment.words
        ]
    return d


def result_dict(segments: Sequence[Segment], info: Optional[TranscriptionInfo]) -> dict:
    """openai-whisper's ``transcribe()`` result: full text, segments, language."""
    return {
        "text": "".join(segment.text for segment in segments),
        "segments": [_segment_dict(segment) for segment in segments],
        "language": info.language if info is not None else None,
    }


_WRITERS = {cls.extension: cls for cls in (TxtWriter, VttWriter, SrtWriter, TsvWriter, JsonWriter)}


def formats_for(fmt: str) -> Tuple[str, ...]:
    """The formats ``fmt`` stands for: itself, or every format for ``"all"``."""
    if fmt == "all":
        return FORMATS
    if fmt not in _WRITERS:
        raise InvalidOptionError(
            f"unknown output format {fmt!r} (choose from {', '.join(FORMATS + ('all',))})"
        )
    return (fmt,)


def get_writer(fmt: str) -> Writer:
    """The writer of one format (not ``"all"``: use :func:`write_result` or :func:`formats_for`)."""
    if fmt not in _WRITERS:
        raise InvalidOptionError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})")
    return _WRITERS[fmt]()


def write_result(
    segments: Iterable[Segment],
    info: Optional[TranscriptionInfo],
    fmt: str,
    output_path: "str | os.PathLike[str]",
) -> List[Path]:
    """Write ``segments`` in format ``fmt`` (or every format for ``"all"``).

    ``output_path`` is the destination without extension; each format appends ``.<ext>``
    (``out/talk`` -> ``out/talk.srt``). Returns the paths written.
    """
    formats = formats_for(fmt)
    segments = list(segments)  # a generator can only be walked once, and "all" walks it five times
    base = os.fspath(output_path)
    written = []
    for f in formats:
        path = Path(f"{base}.{f}")
        # newline="" keeps "\n" line ends on every platform, as the files are compared byte for byte.
        with open(path, "w", encoding="utf-8", newline="") as file:
            get_writer(f).write(segments, info, file)
        written.append(path)
    return written
