#!/usr/bin/env python3
"""Write golden transcript files with openai-whisper's own writers (whisper/utils.py).

A fixed set of transcripts (CASES below: plain segments, word-timed segments, edge cases such as
times past one hour, empty text, "-->" and tabs in text, long lines, long pauses, segments
without words, sub-millisecond rounding) is fed to openai-whisper's WriteTXT, WriteVTT, WriteSRT,
WriteTSV and WriteJSON; vtt/srt also under each set of word-level options in SUBTITLE_OPTIONS
(highlight_words, max_line_width, max_line_count, max_words_per_line), passed as openai-whisper's
command line passes them.

Output, under tests/data/writers/:
  cases.json                 the transcripts (openai-whisper result dicts) and option sets
  <case>.{txt,tsv,json}      openai-whisper's files
  <case>.<options>.{vtt,srt} openai-whisper's subtitle files under each option set

tests/test_writers.py rebuilds ostinato segments from cases.json and compares ostinato's writer
output with these files byte for byte.

Usage:  python dev/make_writer_goldens.py
"""
from __future__ import annotations

import io
import json
import sys
from importlib.metadata import version
from pathlib import Path

from whisper.utils import WriteJSON, WriteSRT, WriteTSV, WriteTXT, WriteVTT

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "writers"


def segment(i, start, end, text, words=None, seek=0):
    s = {
        "id": i,
        "seek": seek,
        "start": start,
        "end": end,
        "text": text,
        "tokens": [50364, 2425 + i, 50414],
        "temperature": 0.0,
        "avg_logprob": -0.25 - i / 8,
        "compression_ratio": 1.5,
        "no_speech_prob": 0.125,
    }
    if words is not None:
        s["words"] = [{"word": w, "start": a, "end": b, "probability": p} for w, a, b, p in words]
    return s


def timed(text, start, step, gap=0.0, probability=0.9):
    """Words of ``text`` (split before spaces), each ``step`` seconds long, ``gap`` apart."""
    pieces = [" " + w for w in text.split(" ") if w]
    out, t = [], start
    for w in pieces:
        out.append((w, round(t, 3), round(t + step, 3), probability))
        t += step + gap
    return out


LONG = (" This line is deliberately long so that it runs well past any sensible subtitle width,"
        " forty-two characters or otherwise, and keeps going.")

CASES = {
    "segments": [
        segment(0, 0.0, 2.0005, " Hello world."),
        segment(1, 2.0005, 59.9995, "  Arrows --> and\ttabs  "),
        segment(2, 59.9995, 61.0, ""),
        segment(3, 61.0, 75.5, LONG),
        segment(4, 3599.9995, 3661.5, " Last one, café. 日本語"),
        segment(5, 7325.0015, 7330.5, " Two hours in.", seek=732500),
    ],
    "words": [
        segment(0, 0.0, 6.2, LONG[:60], words=timed(LONG[:60], 0.0, 0.5, 0.02)),
        # A pause of over 3 s; "-->" inside a word; zero-length and touching words.
        segment(1, 10.0, 11.5, " Short one-->arrow. Yes", words=[
            (" Short", 10.0, 10.4, 0.8), (" one-->arrow.", 10.4, 11.0, 0.6), (" Yes", 11.0, 11.0, 0.1)]),
        segment(2, 11.5, 12.0, " ...", words=[]),
        # Gaps between words (highlighting fills them), sub-millisecond rounding.
        segment(3, 12.0005, 16.0, " Gaps between the words here.", words=[
            (" Gaps", 12.0005, 12.5, 0.9), (" between", 12.9, 13.4, 0.9), (" the", 13.4, 13.6, 0.9),
            (" words", 14.2, 14.9, 0.9), (" here.", 15.5, 15.9995, 0.9)]),
        segment(4, 3700.0, 3706.0, " Over an hour in, with words and more words.",
                words=timed(" Over an hour in, with words and more words.", 3700.0, 0.6), seek=370000),
        segment(5, 7200.25, 7203.0, " 二時間 later", words=[
            (" 二時間", 7200.25, 7201.5, 0.7), (" later", 7201.5, 7203.0, 0.95)], seek=720025),
    ],
    "words_first_empty": [
        segment(0, 0.5, 1.0, " ", words=[]),
        segment(1, 1.0, 3.0, " Words start later.", words=timed(" Words start later.", 1.25, 0.5)),
        segment(2, 7.5, 9.0, " After a long pause.", words=timed(" After a long pause.", 7.5, 0.3, 0.05)),
    ],
    "empty": [],
}

SUBTITLE_OPTIONS = {
    "default": {},
    "highlight": {"highlight_words": True},
    "width20": {"max_line_width": 20},
    "width20_count2": {"max_line_width": 20, "max_line_count": 2},
    "width42_count1": {"max_line_width": 42, "max_line_count": 1},
    "count2": {"max_line_count": 2},
    "words3": {"max_words_per_line": 3},
    "words3_highlight": {"max_words_per_line": 3, "highlight_words": True},
    "width15_count3_words2_highlight": {
        "max_line_width": 15, "max_line_count": 3, "max_words_per_line": 2, "highlight_words": True},
}


def result_of(segments):
    # ostinato's result text is the segments' texts joined (openai-whisper decodes all tokens).
    return {"text": "".join(s["text"] for s in segments), "segments": segments, "language": "en"}


def render(writer_class, result, **kwargs) -> bytes:
    out = io.StringIO()
    writer_class(str(OUT)).write_result(result, file=out, **kwargs)
    return out.getvalue().encode("utf-8")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*"):
        if old.suffix in (".txt", ".tsv", ".json", ".vtt", ".srt"):
            old.unlink()
    written = 0
    for case, segments in CASES.items():
        result = result_of(segments)
        for writer_class in (WriteTXT, WriteTSV, WriteJSON):
            (OUT / f"{case}.{writer_class.extension}").write_bytes(render(writer_class, result))
            written += 1
        has_words = bool(segments) and "words" in segments[0]
        for name, options in SUBTITLE_OPTIONS.items():
            if not has_words and name not in ("default", "highlight"):
                continue  # word options do nothing without words
            for writer_class in (WriteVTT, WriteSRT):
                data = render(writer_class, result, **options)
                (OUT / f"{case}.{name}.{writer_class.extension}").write_bytes(data)
                written += 1
    spec = {
        "generator": f"openai-whisper {version('openai-whisper')} whisper.utils writers",
        "cases": CASES,
        "subtitle_options": SUBTITLE_OPTIONS,
    }
    (OUT / "cases.json").write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {written} golden files and cases.json to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
