"""dev/engine_timeline.py: the engine's timeline as it reads it (bursts, phases, waits) and as it records it."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dev"))
import engine_timeline  # noqa: E402


def test_bursts_and_their_summary_by_hand():
    events = [
        ["audio", 0.0, 1.0, [0, 16000 * 5]],
        ["audio", 0.5, 2.0, [1, 16000 * 60]],  # overlaps audio 0: one burst
        ["audio", 3.0, 3.5, [2, 16000 * 5]],  # alone
        ["wait", 0.0, 0.25, 0], ["answer", 0.25, 0.5, ["encode"]], ["collect", 0.6, 0.7, 1],
        ["request:encode", 0.1, 0.3, 0], ["request:decode", 0.3, 0.9, 0],
        ["request:encode", 0.6, 0.7, 1], ["request:decode", 0.7, 1.9, 1], ["request:decode", 3.1, 3.4, 2],
    ]
    groups = engine_timeline.bursts(events)
    assert [(s, e, [a[3][0] for a in audios]) for s, e, audios in groups] == [(0.0, 2.0, [0, 1]), (3.0, 3.5, [2])]
    s = engine_timeline.summary(events, *groups[0])
    assert s["wall"] == 2.0
    assert s["phases"] == pytest.approx({"wait": 0.25, "answer": 0.25, "admit": 0.0, "advance": 0.0, "collect": 0.1})
    assert s["requests"]["decode"] == pytest.approx([0.6, 1.2]) and s["requests"]["encode"] == pytest.approx([0.2, 0.1])
    (short,), (long_,) = s["audios"]["short"], s["audios"]["long"]
    assert short == pytest.approx({"encode": 0.2, "decode": 0.6, "total": 1.0})
    assert long_ == pytest.approx({"encode": 0.1, "decode": 1.2, "total": 1.5})


def test_an_audio_served_over_http_shows_the_time_before_and_after_the_engine():
    events = [
        ["http", 0.9, 2.25, 7], ["audio", 1.0, 2.0, [0, 16000 * 5, 7]],
        ["audio", 1.5, 2.5, [1, 16000 * 5, None]],  # submitted without a request (the Python API)
        ["request:decode", 1.2, 1.9, 0],
    ]
    s = engine_timeline.summary(events, *engine_timeline.bursts(events)[0])
    served, direct = s["audios"]["short"]
    assert served == pytest.approx({"decode": 0.7, "total": 1.0, "http before": 0.1, "http after": 0.25})
    assert direct == pytest.approx({"total": 1.0})


def test_install_http_records_each_transcription_request_and_hands_its_id_to_the_handler():
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    original = fastapi.FastAPI.__call__
    engine_timeline.events.clear()
    try:
        engine_timeline.install_http()
        app = fastapi.FastAPI()

        @app.post("/v1/audio/transcriptions")
        async def transcribe():
            return {"request": engine_timeline._http_request.get()}

        @app.get("/health")
        async def health():
            return {"request": engine_timeline._http_request.get()}

        with TestClient(app) as client:
            seen = [client.post("/v1/audio/transcriptions").json()["request"] for _ in range(2)]
            assert client.get("/health").json() == {"request": None}  # not a transcription: not timed
    finally:
        fastapi.FastAPI.__call__ = original
    spans = [e for e in engine_timeline.events if e[0] == "http"]
    engine_timeline.events.clear()
    assert [e[3] for e in spans] == seen and seen[1] == seen[0] + 1
    assert all(e[2] >= e[1] for e in spans)


def test_install_records_an_engine_at_work(tiny_en_path):
    from ostinato import WhisperModel
    from ostinato.models.whisper import decoding, engine
    from ostinato.runtime import graphs, scheduler

    saved = {(cls, name): cls.__dict__[name] for cls, names in (
        (engine.TranscriptionEngine, ("_next_requests", "_answer_all", "_enqueue", "_answer", "submit",
                                      "_worker_finished")),
        (decoding.GreedyRun, ("admit", "advance", "collect")),
        (graphs.StepGraph, ("__call__", "capture", "capture_deferred")),
        (scheduler.RowScheduler, ("use_spare_time",))) for name in names}
    engine_timeline.events.clear()
    try:
        engine_timeline.install()
        model = WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")
        audio = (0.05 * np.random.default_rng(0).standard_normal(16000 * 3)).astype(np.float32)
        model.transcribe_batch([audio, audio[: 16000 * 2]], batch_size=2, beam_size=1, best_of=1, temperature=0.0)
    finally:
        for (cls, name), method in saved.items():
            setattr(cls, name, method)
    (start, end, audios), = engine_timeline.bursts(engine_timeline.events)
    assert sorted(a[3][1] for a in audios) == [16000 * 2, 16000 * 3]
    s = engine_timeline.summary(engine_timeline.events, start, end, audios)
    assert {"features", "encode", "decode"} <= set(s["requests"])
    assert s["phases"]["advance"] > 0 and s["phases"]["collect"] >= 0
    steps = [e[3] for e in engine_timeline.events if e[0] == "step"]
    assert any(name == "whisper decode step" for name, _, _ in steps)
    assert not any(replay for _, _, replay in steps)  # no graphs on the CPU
    engine_timeline.events.clear()


def test_steps_by_key_and_the_last_audio_s_chain_by_hand(capsys):
    events = [
        ["audio", 0.0, 0.1, [0, 16000 * 5]], ["audio", 0.0, 0.5, [1, 16000 * 60]],
        ["request:features", 0.01, 0.03, 1], ["request:encode", 0.035, 0.04, 1], ["request:decode", 0.05, 0.45, 1],
        ["request:decode", 0.02, 0.08, 0],
        ["step", 0.1, 0.102, ["decode", "k16", False]], ["step", 0.2, 0.2005, ["decode", "k16", True]],
        ["step", 0.3, 0.3005, ["decode", "k16", True]],
    ]
    (start, end, audios), = engine_timeline.bursts(events)
    engine_timeline._print_steps(events)
    engine_timeline._print_chain(events, start, audios)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["step", "eager", "1", "2.0", "ms", "host", "decode", "k16"]
    assert out[1].split() == ["step", "replay", "2", "1.0", "ms", "host", "decode", "k16"]
    # audio 1 finished last: asked for features 10 ms in, encode 5 ms after they came, decode 10 ms after
    assert "feat +10 @10 20.0; enco +5 @35 5.0; deco +10 @50 400.0; +50 to its end" in out[2]
