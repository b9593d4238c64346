"""Run ostinato's window loop against recorded faster-whisper decodes (tests/data/refs/*_decoding.json).

Every CTranslate2 call faster-whisper made is in the reference, fallback attempts included. The
replay sits where ostinato's loop calls the model's ``decode``: for each call it checks that the
prompt and the search options are the ones faster-whisper used; a temperature-0 call (greedy or
beam search) is decoded for real and its tokens compared; a sampled call (temperature > 0, drawn
from CTranslate2's random generator, which nothing else reproduces) returns the recorded result,
so the windows after a fallback see the same prompts and seeks as faster-whisper's did.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import pytest

from ostinato.models.whisper.decoding import SearchOptions, WindowResult

REFS = Path(__file__).parent / "data" / "refs" / "faster_whisper_tiny_en_decoding.json"


def load_refs() -> dict:
    return json.loads(REFS.read_text())


# ostinato keyword arguments for a reference run's faster-whisper options.
def ostinato_options(fw_options: dict) -> dict:
    return dict(fw_options)


@dataclass
class CallCheck:
    index: int
    temperature: float
    want: List[int]
    got: List[int]
    want_score: float
    got_score: float
    want_no_speech: float
    got_no_speech: float

    @property
    def tokens_match(self) -> bool:
        return self.want == self.got


@dataclass
class Replay:
    model: object
    calls: List[dict]
    checks: List[CallCheck] = field(default_factory=list)
    position: int = 0

    def decode(self, audio_features, requests, suppress, suppress_at_begin, options: SearchOptions = None):
        assert len(requests) == 1
        assert self.position < len(self.calls), "ostinato decoded more windows or attempts than faster-whisper"
        call = self.calls[self.position]
        self.position += 1
        expected = call["options"]
        assert requests[0].prompt == call["prompt"], f"call {self.position - 1}: prompts differ"
        temperature = expected.get("sampling_temperature", 1.0) if expected.get("sampling_topk") == 0 else 0.0
        assert options.temperature == temperature
        if temperature > 0:
            assert options.num_hypotheses == expected["num_hypotheses"]
            assert options.beam_size == 1
            tokens = call["tokens"]
            return [WindowResult(list(tokens), math.nan, call["no_speech_prob"], call["score"])]
        assert options.beam_size == expected["beam_size"]
        assert options.patience == expected["patience"]
        assert options.length_penalty == expected["length_penalty"]
        (result,) = type(self.model).decode(self.model, audio_features, requests, suppress, suppress_at_begin, options)
        self.checks.append(CallCheck(
            self.position - 1, temperature, call["tokens"], result.tokens, call["score"], result.score,
            call["no_speech_prob"], result.no_speech_prob,
        ))
        return [result]


def run_replayed(model, monkeypatch, audio_path: str, reference: dict):
    """Transcribe with the reference's options, replaying its sampled calls; returns (segments, replay)."""
    replay = Replay(model, reference["calls"])
    monkeypatch.setattr(model, "decode", replay.decode)
    try:
        segments, _ = model.transcribe(audio_path, **ostinato_options(reference["options"]))
        segments = list(segments)
    finally:
        monkeypatch.undo()
    assert replay.position == len(replay.calls), "faster-whisper decoded more windows or attempts"
    return segments, replay


def assert_matches(segments, replay: Replay, reference: dict, avg_logprob_tol: float = 1e-4) -> None:
    for check in replay.checks:
        assert check.got == check.want, f"call {check.index}: tokens differ"
        # A score sums a log-probability per token in float32: relative to its size, the rounding of
        # the CPU's vector units (which differ between machines) can reach a few 1e-5.
        assert check.got_score == pytest.approx(check.want_score, rel=1e-4, abs=1e-4), f"call {check.index}: score"
        assert check.got_no_speech == pytest_approx(check.want_no_speech, 1e-4), f"call {check.index}: no-speech"
    want = reference["segments"]
    assert [s.tokens for s in segments] == [w["tokens"] for w in want]
    for got, w in zip(segments, want):
        assert (got.id, got.seek, got.text) == (w["id"], w["seek"], w["text"])
        assert got.start == pytest_approx(w["start"], 1e-6)
        assert got.end == pytest_approx(w["end"], 1e-6)
        assert got.temperature == pytest_approx(w["temperature"], 1e-9)
        assert got.avg_logprob == pytest_approx(w["avg_logprob"], avg_logprob_tol)
        assert got.compression_ratio == pytest_approx(w["compression_ratio"], 1e-5)
        assert got.no_speech_prob == pytest_approx(w["no_speech_prob"], 1e-4)


def pytest_approx(value, tol):
    import pytest

    return pytest.approx(value, abs=tol)
