"""Transcript writers: txt, vtt, srt, tsv and json files.

Each writer produces byte-for-byte the file openai-whisper's command line writes for the same
segments, including word-timed subtitles under its --highlight_words, --max_line_width,
--max_line_count and --max_words_per_line options, so tools built around those files keep
working. The rules (timestamp rounding, cue layout, text clean-up) are reimplemented here, not
imported; tests compare against files written by openai-whisper itself.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, TextIO, Tuple

from .checks import check_positive_int
from .errors import InvalidOptionError
from .results import Segment, TranscriptionInfo

FORMATS = ("txt", "vtt", "srt", "tsv", "json")

# Without limits, openai-whisper's word-timed cues break a line after 1000 characters and a
# segment's words into chunks of 1000.
_DEFAULT_MAX_LINE_WIDTH = 1000
_DEFAULT_MAX_WORDS_PER_LINE = 1000
# When cues may span segments (both a line width and a line count are given), a pause longer than
# this many seconds before a word starts a new cue.
_LONG_PAUSE = 3.0

Cue = Tuple[str, str, str]  # formatted start, formatted end, text


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


@dataclass(frozen=True)
class SubtitleOptions:
    """openai-whisper's word-level subtitle options (they need segments with word timings).

    highlight_words: underline each word in turn (one cue per word, plus gap cues).
    max_line_width: characters per line before a line break; with ``max_line_count`` as well,
        cues may span segments and break at that many lines or at a pause of over 3 s.
    max_line_count: lines per cue (only together with ``max_line_width``).
    max_words_per_line: words per cue while cues keep to segments (openai-whisper warns that it
        has no effect with ``max_line_width``; it still applies when no line count is given).
    None means no limit; a limit is a positive integer.
    """

    highlight_words: bool = False
    max_line_width: Optional[int] = None
    max_line_count: Optional[int] = None
    max_words_per_line: Optional[int] = None

    def validate(self) -> None:
        for name in ("max_line_width", "max_line_count", "max_words_per_line"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))


class Writer:
    """Writes one transcript format to an open text file."""

    extension: str = ""

    def write(
        self,
        segments: Sequence[Segment],
        info: Optional[TranscriptionInfo],
        file: TextIO,
        options: Optional[SubtitleOptions] = None,
    ) -> None:
        raise NotImplementedError


class TxtWriter(Writer):
    extension = "txt"

    def write(self, segments, info, file, options=None):
        for segment in segments:
            file.write(segment.text.strip() + "\n")


class _SubtitleWriter(Writer):
    always_include_hours = False
    decimal_marker = "."

    def timestamp(self, seconds: float) -> str:
        return format_timestamp(seconds, self.always_include_hours, self.decimal_marker)

    def cues(self, segments: Sequence[Segment], options: Optional[SubtitleOptions] = None) -> Iterator[Cue]:
        """The (start, end, text) cues of a subtitle file, timestamps already formatted.

        openai-whisper decides by the first segment alone whether the transcript has word
        timings; with them, cues are built from words (see ``_word_cues``), otherwise one
        segment gives one cue.
        """
        options = options or SubtitleOptions()
        options.validate()
        if segments and segments[0].words is not None:
            yield from self._word_cues(segments, options)
            return
        for segment in segments:
            # "-->" inside the text would read as a cue timing line to subtitle parsers.
            text = segment.text.strip().replace("-->", "->")
            yield self.timestamp(segment.start), self.timestamp(segment.end), text

    def _word_cues(self, segments: Sequence[Segment], options: SubtitleOptions) -> Iterator[Cue]:
        for cue in _group_words(segments, options):
            start, end = self.timestamp(cue[0].start), self.timestamp(cue[-1].end)
            texts = [word.text for word in cue]
            text = "".join(texts)
            if not options.highlight_words:
                yield start, end, text
                continue
            # One cue per word with that word underlined; a gap before a word repeats the plain text.
            last = start
            for i, word in enumerate(cue):
                word_start, word_end = self.timestamp(word.start), self.timestamp(word.end)
                if last != word_start:
                    yield last, word_start, text
                yield word_start, word_end, "".join(_underline(t) if j == i else t for j, t in enumerate(texts))
                last = word_end


@dataclass
class _CueWord:
    start: float
    end: float
    text: str  # the word as shown: first word of a line stripped, "\n" before a wrapped line


def _underline(text: str) -> str:
    """``<u>...</u>`` around the word, after its leading whitespace (and line break)."""
    return _UNDERLINE.sub(r"\1<u>\2</u>", text)


_UNDERLINE = re.compile(r"^(\s*)(.*)$")


def _group_words(segments: Sequence[Segment], options: SubtitleOptions) -> Iterator[List[_CueWord]]:
    """Group word timings into cues and lines under openai-whisper's layout rules.

    Without both a line width and a line count, cues never span segments: every chunk of
    ``max_words_per_line`` words of a segment starts a new cue. With both, words flow across
    segments and a new cue starts when the line count is reached or after a pause of over 3 s.
    A word starts a new line when the line would grow past the width; the first word of a line
    is stripped, the others keep their leading space. "-->" is kept, as openai-whisper does.
    """
    max_line_count = options.max_line_count or None
    max_line_width = options.max_line_width or None
    preserve_segments = max_line_count is None or max_line_width is None
    line_width = max_line_width or _DEFAULT_MAX_LINE_WIDTH
    chunk_size = options.max_words_per_line or _DEFAULT_MAX_WORDS_PER_LINE

    first_start = next((w.start for s in segments for w in (s.words or [])), segments[0].start if segments else None)
    last = first_start or 0.0
    line_len = 0
    line_count = 1
    cue: List[_CueWord] = []
    for segment in segments:
        words = segment.words or []
        for chunk_start in range(0, len(words), chunk_size):
            for i, word in enumerate(words[chunk_start : chunk_start + chunk_size]):
                text = word.word
                long_pause = not preserve_segments and word.start - last > _LONG_PAUSE
                has_room = line_len + len(text) <= line_width
                segment_break = i == 0 and len(cue) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not segment_break:
                    line_len += len(text)  # the line goes on
                else:
                    text = text.strip()
                    if (cue and max_line_count is not None and (long_pause or line_count >= max_line_count)) or segment_break:
                        yield cue  # a new cue
                        cue = []
                        line_count = 1
                    elif line_len > 0:  # a new line in this cue
                        line_count += 1
                        text = "\n" + text
                    line_len = len(text.strip())
                cue.append(_CueWord(word.start, word.end, text))
                last = word.start
    if cue:
        yield cue


class VttWriter(_SubtitleWriter):
    extension = "vtt"

    def write(self, segments, info, file, options=None):
        file.write("WEBVTT\n\n")
        for start, end, text in self.cues(segments, options):
            file.write(f"{start} --> {end}\n{text}\n\n")


class SrtWriter(_SubtitleWriter):
    extension = "srt"
    always_include_hours = True
    decimal_marker = ","

    def write(self, segments, info, file, options=None):
        for number, (start, end, text) in enumerate(self.cues(segments, options), start=1):
            file.write(f"{number}\n{start} --> {end}\n{text}\n\n")


class TsvWriter(Writer):
    """Integer milliseconds, so no locale can turn a decimal point into a comma."""

    extension = "tsv"

    def write(self, segments, info, file, options=None):
        file.write("start\tend\ttext\n")
        for segment in segments:
            text = segment.text.strip().replace("\t", " ")
            file.write(f"{round(1000 * segment.start)}\t{round(1000 * segment.end)}\t{text}\n")


class JsonWriter(Writer):
    extension = "json"

    def write(self, segments, info, file, options=None):
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
    options: Optional[SubtitleOptions] = None,
) -> List[Path]:
    """Write ``segments`` in format ``fmt`` (or every format for ``"all"``).

    ``output_path`` is the destination without extension; each format appends ``.<ext>``
    (``out/talk`` -> ``out/talk.srt``). ``options`` shape word-timed vtt/srt cues. Returns the
    paths written.
    """
    formats = formats_for(fmt)
    if options is not None:
        options.validate()
    segments = list(segments)  # a generator can only be walked once, and "all" walks it five times
    base = os.fspath(output_path)
    written = []
    for f in formats:
        path = Path(f"{base}.{f}")
        # newline="" keeps "\n" line ends on every platform, as the files are compared byte for byte.
        with open(path, "w", encoding="utf-8", newline="") as file:
            get_writer(f).write(segments, info, file, options)
        written.append(path)
    return written
