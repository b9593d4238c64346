"""A transcription in OpenAI's response formats: json, text, srt, vtt, verbose_json."""
from __future__ import annotations

import io
import math
from typing import List, Tuple

from ..results import Segment, TranscriptionInfo
from ..writers import get_writer

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
               "srt": "text/plain; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}


def full_text(segments: List[Segment]) -> str:
    return "".join(s.text for s in segments).strip()


def usage(info: TranscriptionInfo) -> dict:
    """OpenAI's usage of a model billed by duration: the audio's seconds, rounded up."""
    return {"type": "duration", "seconds": math.ceil(info.duration)}


def render(segments: List[Segment], info: TranscriptionInfo, fmt: str, task: str, words: bool) -> Tuple[object, str]:
    """(body, media type): a dict for the JSON formats, a string for the others."""
    if fmt == "json":
        return {"text": full_text(segments), "usage": usage(info)}, MEDIA_TYPES[fmt]
    if fmt == "verbose_json":
        body = {
            "task": task,
            "language": info.language,
            "duration": info.duration,
            "text": full_text(segments),
            "usage": usage(info),
            "segments": [
                {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens),
                 "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                 "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                for s in segments
            ],
        }
        if words:
            body["words"] = [{"word": w.word, "start": w.start, "end": w.end}
                             for s in segments for w in (s.words or [])]
        return body, MEDIA_TYPES[fmt]
    if fmt == "text":
        return full_text(segments) + "\n", MEDIA_TYPES[fmt]
    out = io.StringIO()
    get_writer(fmt).write(segments, info, out)
    return out.getvalue(), MEDIA_TYPES[fmt]
