"""The VAD filter and the batched pipeline: parity with faster-whisper 1.2.1, and their pieces.

References in tests/data/refs/faster_whisper_vad_tiny_en.json come from faster-whisper itself
(dev/make_vad_refs.py: tiny.en, CPU, float32, its bundled Silero VAD v6 through onnxruntime) on
two long recordings with pauses and noise that ostinato.testing.recordings builds from the test
clips. The tests that run the VAD skip when the optional extra (``ostinato[vad]``) is missing;
the VAD's rules on given probabilities, the options and the errors are tested without it.
"""
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import pytest

from ostinato.audio import vad
from ostinato.audio.vad import Span, TimestampMap, VadOptions, collect_chunks, speech_spans, vad_options
from ostinato.errors import InvalidOptionError, MissingExtraError
from ostinato.models.whisper.options import TranscribeOptions

REFS_FILE = Path(__file__).parent / "data" / "refs" / "faster_whisper_vad_tiny_en.json"
GREEDY = dict(beam_size=1, temperature=0.0)
needs_vad = pytest.mark.skipif(not vad.onnx_available(), reason="the VAD extra is not installed: pip install '.[vad]'")
# The torch backend's weights come from silero-vad 6.0/6.1, which is not part of the extra.
needs_torch_vad = pytest.mark.skipif(
    not (vad.onnx_available() and vad.torch_weights_available()), reason="silero-vad 6.0/6.1 is not installed")


def _refs():
    return json.loads(REFS_FILE.read_text())


@pytest.fixture(scope="module")
def refs():
    return _refs()


@pytest.fixture(scope="module")
def recordings(refs):
    from ostinato.testing.recordings import build, fingerprint

    built = {}
    for name, meta in refs["recordings"].items():
        audio = build(name)
        assert fingerprint(audio) == meta["sha256"], f"{name} is not the audio the references were made from"
        built[name] = audio
    return built


@pytest.fixture(scope="module")
def model(tiny_en_path, one_torch_thread):
    from ostinato import WhisperModel

    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


def _options(run: dict) -> dict:
    """A reference run's faster-whisper options as ostinato's keyword arguments."""
    options = dict(run["options"])
    if run["pipeline"] == "batched":
        options["batched"] = True
    return options


def _assert_matches(segments, expected, duration):
    """Same tokens, texts and times (faster-whisper's rounding) and words; scores within 2e-3."""
    segments = list(segments)
    assert [s.tokens for s in segments] == [s["tokens"] for s in expected["segments"]]
    for got, want in zip(segments, expected["segments"]):
        assert (got.id, got.seek, got.text, got.start, got.end) == (
            want["id"], want["seek"], want["text"], want["start"], want["end"]), got
        assert got.avg_logprob == pytest.approx(want["avg_logprob"], abs=2e-3)
        assert got.no_speech_prob == pytest.approx(want["no_speech_prob"], abs=2e-3)
        assert got.compression_ratio == pytest.approx(want["compression_ratio"], abs=1e-5)
        assert got.temperature == want["temperature"]
        if want["words"] is None:
            assert got.words is None
            continue
        assert [(w.word, w.start, w.end) for w in got.words] == [(w["word"], w["start"], w["end"]) for w in want["words"]]
        for w, ref in zip(got.words, want["words"]):
            assert w.probability == pytest.approx(ref["probability"], abs=1e-3)
    assert all(s.end <= duration + 1e-6 for s in segments)
    return segments


# What test_matches_faster_whisper runs by default: every option set on "pauses", and on "lecture"
# what nothing else covers (the engine tests below take both recordings through batched_words
# and vad_greedy). OSTINATO_VAD_PARITY=all runs every reference (a few more CPU minutes).
DEFAULT_CASES = {
    ("vad_greedy", "pauses"), ("vad_default", "pauses"), ("vad_parameters_greedy", "pauses"),
    ("vad_words_greedy", "pauses"), ("batched_greedy", "pauses"), ("batched_words", "pauses"),
    ("batched_timestamps_greedy", "pauses"), ("batched_parameters_greedy", "lecture"),
}


def _cases():
    refs = _refs()
    every = os.environ.get("OSTINATO_VAD_PARITY") == "all"
    for run, per_recording in refs["runs"].items():
        for name in per_recording:
            if every or (run, name) in DEFAULT_CASES:
                yield pytest.param(run, name, id=f"{run}-{name}")


# -- parity with faster-whisper ------------------------------------------------------------------

@needs_vad
@pytest.mark.parametrize("run,name", list(_cases()))
def test_matches_faster_whisper(model, refs, recordings, run, name):
    expected = refs["runs"][run][name]
    if expected["windows"] is not None:  # faster-whisper's sampled windows cannot be reproduced
        assert all(t == 0.0 for t in expected["windows"]), "a reference window fell back to sampling"
    segments, info = model.transcribe(recordings[name], **_options(expected))
    assert info.language == expected["language"]
    assert info.duration == pytest.approx(expected["duration"], abs=1e-6)  # the reference keeps 6 decimals
    assert info.duration_after_vad == pytest.approx(expected["duration_after_vad"], abs=1e-6)
    assert info.vad_options == expected["vad_options"]
    _assert_matches(segments, expected, info.duration)


@needs_vad
def test_batched_chunks_of_many_audios_share_the_rows(model, refs, recordings, monkeypatch):
    """transcribe_batch(batched=True): every recording's chunks in one engine, the results as alone."""
    from ostinato.runtime import scheduler

    admitted = []
    original = scheduler.RowScheduler.admit

    def counting(self, *args, **kwargs):
        before = len(self._admitted)
        original(self, *args, **kwargs)
        admitted.append(len(self._admitted) - before)

    monkeypatch.setattr(scheduler.RowScheduler, "admit", counting)
    names = list(recordings)
    outcomes = model.transcribe_batch([recordings[n] for n in names], batch_size=8, batched=True,
                                      word_timestamps=True)
    for name, (segments, info) in zip(names, outcomes):
        _assert_matches(segments, refs["runs"]["batched_words"][name], info.duration)
    assert max(admitted) > 1  # chunks were admitted together


@needs_vad
def test_vad_filter_through_the_engine(model, refs, recordings):
    names = list(recordings)
    outcomes = model.transcribe_batch([recordings[n] for n in names], batch_size=4, vad_filter=True, **GREEDY)
    for name, (segments, info) in zip(names, outcomes):
        _assert_matches(segments, refs["runs"]["vad_greedy"][name], info.duration)


@needs_torch_vad
def test_torch_backend_gives_the_same_transcript(model, refs, recordings, monkeypatch):
    """The VAD in PyTorch (CUDA's default) on the CPU: the same spans, so the same segments."""
    monkeypatch.setenv("OSTINATO_VAD_BACKEND", "torch")
    name = "pauses"
    segments, info = model.transcribe(recordings[name], batched=True, **GREEDY)
    _assert_matches(segments, refs["runs"]["batched_greedy"][name], info.duration)


# -- the VAD on the recordings -------------------------------------------------------------------

@needs_vad
@pytest.mark.parametrize("backend,tolerance", [
    ("onnx", 1e-5), pytest.param("torch", 1e-4, marks=needs_torch_vad)])
def test_speech_probabilities(refs, recordings, backend, tolerance):
    network = vad.load_vad("cpu", backend)
    for name, audio in recordings.items():
        expected = refs["vad"][name]
        probs = vad.speech_probabilities(audio, network)
        assert probs.shape == (audio.shape[0] // 512 + 1,)
        strided = probs[:: expected["probability_stride"]]
        np.testing.assert_allclose(strided, expected["probabilities"], atol=tolerance, rtol=0)
        for case, want in expected["cases"].items():
            got = speech_spans(probs, audio.shape[0], vad_options(want["options"]))
            assert [list(s) for s in got] == want["spans"], (name, case)


@needs_torch_vad
def test_onnx_and_torch_backends_agree_on_random_audio():
    rng = np.random.RandomState(3)
    audio = (rng.standard_normal(16000 * 7 + 123) * 0.1).astype(np.float32)
    onnx = vad.speech_probabilities(audio, vad.load_vad("cpu", "onnx"))
    torch_ = vad.speech_probabilities(audio, vad.load_vad("cpu", "torch"))
    np.testing.assert_allclose(torch_, onnx, atol=1e-4, rtol=0)


@needs_torch_vad
def test_torch_backend_carries_the_lstm_state_across_pieces(monkeypatch):
    """Long audio runs the LSTM in pieces (cuDNN refuses an hour as one sequence): the state carries,
    so the probabilities equal onnxruntime's whatever the piece size."""
    rng = np.random.RandomState(5)
    audio = (rng.standard_normal(16000 * 5) * 0.1).astype(np.float32)
    onnx = vad.speech_probabilities(audio, vad.load_vad("cpu", "onnx"))
    network = vad.load_vad("cpu", "torch")
    monkeypatch.setattr(network, "LSTM_PIECE", 7)  # 157 windows: 23 pieces, the last one short
    np.testing.assert_allclose(vad.speech_probabilities(audio, network), onnx, atol=1e-4, rtol=0)


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("OSTINATO_VAD_BACKEND", raising=False)
    monkeypatch.setattr(vad, "torch_weights_available", lambda: True)
    monkeypatch.setattr(vad, "onnx_available", lambda: True)
    assert vad.resolve_backend("auto", "cpu") == "onnx"
    assert vad.resolve_backend("auto", "cuda:0") == "torch"
    monkeypatch.setattr(vad, "onnx_available", lambda: False)
    assert vad.resolve_backend("auto", "cpu") == "torch"  # only silero-vad's weights are installed
    monkeypatch.setattr(vad, "onnx_available", lambda: True)
    monkeypatch.setattr(vad, "torch_weights_available", lambda: False)
    assert vad.resolve_backend("auto", "cuda:0") == "onnx"  # without silero-vad's weights
    assert vad.resolve_backend("torch", "cpu") == "torch"
    monkeypatch.setenv("OSTINATO_VAD_BACKEND", "torch")
    assert vad.resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(InvalidOptionError, match="unknown VAD backend"):
        vad.resolve_backend("tflite", "cpu")


# -- the VAD's rules on given probabilities (faster-whisper's answers) ----------------------------

A = [0.0] * 10 + [0.9] * 20 + [0.0] * 100
B = [0.1] * 5 + [0.8] * 30 + [0.2] * 20 + [0.7] * 25 + [0.05] * 80 + [0.95] * 10 + [0.3] * 3
C = [0.9] * 200 + [0.2] * 6 + [0.9] * 300 + [0.0] * 10
D = [0.0] * 20 + [0.6] * 3 + [0.0] * 50 + [0.6] * 40 + [0.4] * 5 + [0.6] * 10 + [0.0] * 40


@pytest.mark.parametrize("probs,samples,params,expected", [
    (A, 130 * 512, {}, [(0, 21760)]),
    (A, 130 * 512, dict(min_silence_duration_ms=100, speech_pad_ms=0), [(5120, 15360)]),
    (B, len(B) * 512 - 100, {}, [(0, 47360), (75520, 88476)]),
    (B, len(B) * 512 - 100, dict(min_silence_duration_ms=160, max_speech_duration_s=30),
     [(0, 23040), (23040, 47360), (75520, 88476)]),
    (C, len(C) * 512, dict(max_speech_duration_s=5, min_silence_duration_ms=500),
     [(0, 67328), (67328, 103936), (103936, 172800), (172800, 240384), (240384, 264192)]),
    (C, len(C) * 512, dict(max_speech_duration_s=5, min_silence_duration_ms=100, speech_pad_ms=30),
     [(0, 79104), (79104, 102880), (104992, 184576), (184576, 259552)]),
    (D, len(D) * 512, dict(min_speech_duration_ms=250, min_silence_duration_ms=100, speech_pad_ms=30,
                           neg_threshold=0.45), [(36896, 58336), (59936, 66016)]),
    (D, len(D) * 512, dict(min_speech_duration_ms=250, min_silence_duration_ms=100, speech_pad_ms=30),
     [(36896, 66016)]),
    ([0.2] * 50, 50 * 512, {}, []),
])
def test_speech_spans_as_faster_whisper(probs, samples, params, expected):
    spans = speech_spans(np.array(probs, dtype=np.float32), samples, vad_options(params))
    assert [tuple(s) for s in spans] == expected


def test_model_windows_as_faster_whisper_builds_them():
    audio = np.arange(1, 1100, dtype=np.float32)  # 1099 samples: three windows once padded
    windows = vad.model_windows(audio)
    assert windows.shape == (3, 576)
    assert not windows[0, :64].any()  # the first window's context is zeros
    assert windows[0, 64:].tolist() == audio[:512].tolist()
    assert windows[1, :64].tolist() == audio[448:512].tolist()  # the previous window's end
    assert windows[2, 64:64 + 75].tolist() == audio[1024:].tolist()
    assert not windows[2, -64:].any()  # faster-whisper zeroes the padded audio's last 64 samples
    # whole windows still get one more, of zeros (faster-whisper pads by 512 - n % 512)
    assert vad.model_windows(np.ones(1024, dtype=np.float32)).shape == (3, 576)



@pytest.mark.parametrize("n", [1099, 1024, 16000 * 3 + 449, 16000 * 3 + 511, 77])
def test_device_windows_are_model_windows(n):
    """The torch backend's windows, built from the samples as a strided view, are faster-whisper's."""
    audio = np.random.RandomState(n).standard_normal(n).astype(np.float32)
    got = vad.device_windows(audio)
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(vad.model_windows(audio)))


@needs_torch_vad
def test_torch_backend_from_samples_equals_from_windows():
    rng = np.random.RandomState(8)
    audio = (rng.standard_normal(16000 * 4 + 300) * 0.1).astype(np.float32)
    network = vad.load_vad("cpu", "torch")
    assert np.array_equal(network.probabilities(audio), network(vad.model_windows(audio)))

def test_collect_chunks():
    audio = np.arange(100_000, dtype=np.float32)
    spans = [Span(1000, 9000), Span(10_000, 12_000), Span(20_000, 60_000), Span(61_000, 62_000)]
    whole = collect_chunks(audio, spans)
    assert len(whole) == 1 and whole[0].offset == 0.0 and whole[0].duration == 51_000 / 16000
    assert whole[0].audio.tolist() == np.concatenate([audio[a:b] for a, b in spans]).tolist()
    pieces = collect_chunks(audio, spans, max_duration=2.0)  # 32000 samples
    assert [(c.offset * 16000, c.duration * 16000) for c in pieces] == [(0, 10_000), (10_000, 40_000),
                                                                        (50_000, 1000)]
    # a first span over the limit comes after an empty piece, as in faster-whisper
    first = collect_chunks(audio, [Span(0, 40_000)], max_duration=2.0)
    assert [c.audio.shape[0] for c in first] == [0, 40_000]
    empty = collect_chunks(audio, [])
    assert len(empty) == 1 and empty[0].audio.shape == (0,) and empty[0].duration == 0.0


def test_timestamp_map():
    spans = [Span(16000, 32000), Span(48000, 64000)]  # 1-2 s and 3-4 s of the recording
    times = TimestampMap(spans)
    assert times.original_time(0.0) == 1.0
    assert times.original_time(0.5) == 1.5
    assert times.original_time(1.0) == 3.0  # the second span's start
    assert times.original_time(1.0, is_end=True) == 2.0  # an end on a span's end stays in it
    assert times.original_time(1.456) == 3.46  # rounded to 2 decimals
    assert times.original_time(5.0) == 7.0  # past the end: the last span


# -- options and errors --------------------------------------------------------------------------

def test_batched_defaults_and_overrides():
    batched = TranscribeOptions(batched=True)
    assert batched.vad_filter is True and batched.without_timestamps is True
    plain = TranscribeOptions()
    assert plain.vad_filter is False and plain.without_timestamps is False
    kept = TranscribeOptions(batched=True, vad_filter=False, without_timestamps=False)
    assert kept.vad_filter is False and kept.without_timestamps is False
    assert TranscribeOptions(vad_filter=True, clip_timestamps="1,5").runs_vad is False  # clips win


def test_batched_vad_options_follow_faster_whisper():
    from ostinato.models.whisper.batched import batched_vad_options

    assert batched_vad_options(None) == VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160)
    # a dict keeps its values but never its own max_speech_duration_s; VadOptions are taken as given
    assert batched_vad_options({"max_speech_duration_s": 5, "speech_pad_ms": 100}) == VadOptions(
        max_speech_duration_s=30, speech_pad_ms=100)
    assert batched_vad_options(VadOptions(threshold=0.3)) == VadOptions(threshold=0.3)


@pytest.mark.parametrize("params,match", [
    ({"treshold": 0.5}, "unknown vad_parameters: treshold"),
    ({"threshold": 1.5}, "threshold must be between 0 and 1"),
    ({"threshold": "high"}, "threshold"),
    ({"neg_threshold": -0.1}, "neg_threshold"),
    ({"min_silence_duration_ms": -1}, "min_silence_duration_ms"),
    ({"max_speech_duration_s": 0}, "max_speech_duration_s"),
    ({"speech_pad_ms": math.nan}, "speech_pad_ms"),
    ({"min_speech_duration_ms": math.inf}, "min_speech_duration_ms must be finite"),
    ([0.5], "vad_parameters must be a dict or VadOptions"),
    (VadOptions(threshold=-1), "threshold"),
])
def test_bad_vad_parameters(params, match):
    with pytest.raises(InvalidOptionError, match=match):
        TranscribeOptions(vad_parameters=params).validate()


@pytest.mark.parametrize("field", ["vad_filter", "batched", "without_timestamps"])
def test_switches_are_booleans(field):
    with pytest.raises(InvalidOptionError, match=f"{field} must be true or false"):
        TranscribeOptions(**{field: "yes"}).validate()


def test_missing_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(vad, "vad_available", lambda: False)
    for options in (TranscribeOptions(vad_filter=True), TranscribeOptions(batched=True)):
        with pytest.raises(MissingExtraError, match=r"pip install 'ostinato\[vad\]'") as caught:
            options.validate()
        assert "\n" not in str(caught.value)
    TranscribeOptions(batched=True, vad_filter=False).validate()  # no VAD, no extra needed
    TranscribeOptions(vad_filter=True, clip_timestamps="0,5").validate()


def test_model_rejects_bad_batched_calls(model, data_dir):
    clip = str(data_dir / "clips" / "c02_numbers.flac")
    with pytest.raises(InvalidOptionError, match="batch_size is for batched=True"):
        model.transcribe(clip, batch_size=4)
    with pytest.raises(InvalidOptionError, match="batch_size must be a positive integer"):
        model.transcribe(clip, batched=True, vad_filter=False, batch_size=0)
    with pytest.raises(InvalidOptionError, match="unknown vad_parameters"):
        model.transcribe(clip, vad_filter=True, vad_parameters={"min_silence": 100})
    long_clip = str(data_dir / "clips" / "c18_long_lecture.flac")
    with pytest.raises(InvalidOptionError, match="needs vad_filter=True or clip_timestamps"):
        model.transcribe(long_clip, batched=True, vad_filter=False)


def test_batched_without_vad_on_short_audio_and_clips(model, data_dir):
    """No VAD: a short audio is one chunk, and clip_timestamps are chunks at the recording's times."""
    clip = str(data_dir / "clips" / "c02_numbers.flac")
    segments, info = model.transcribe(clip, batched=True, vad_filter=False, **GREEDY)
    segments = list(segments)
    assert len(segments) == 1 and segments[0].start == 0.0
    assert segments[0].end == round(round(info.duration, 3), 2)  # the chunk's end, mapped back (2 decimals)
    assert info.vad_options is None and info.duration_after_vad == info.duration
    segments, info = model.transcribe(clip, batched=True, clip_timestamps="1.5,6,7", **GREEDY)
    assert [(s.start, s.end, s.seek) for s in segments] == [(1.5, 6.0, 150), (7.0, round(info.duration, 3), 700)]


# -- the command line ----------------------------------------------------------------------------

def test_cli_flags_reach_the_model(monkeypatch, tmp_path, capsys):
    from ostinato import cli, loading
    from ostinato.results import TranscriptionInfo

    calls = []

    class Fake:
        def transcribe(self, audio, **options):
            calls.append(options)
            return iter(()), TranscriptionInfo(language="en", language_probability=1.0, duration=1.0)

    monkeypatch.setattr(loading, "load_model", lambda model, **kw: Fake())
    monkeypatch.setattr(vad, "vad_available", lambda: True)
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"never read")
    assert cli.main(["transcribe", str(audio), "--batched", "-o", str(tmp_path), "-f", "txt", "-q"]) == 0
    assert calls[-1]["batched"] is True and calls[-1]["vad_filter"] is True and calls[-1]["without_timestamps"] is True
    assert cli.main(["transcribe", str(audio), "--vad-filter", "-o", str(tmp_path), "-f", "txt", "-q"]) == 0
    assert calls[-1]["batched"] is False and calls[-1]["vad_filter"] is True and calls[-1]["without_timestamps"] is False


def test_cli_without_the_extra_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    from ostinato import cli, loading

    def no_model(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(loading, "load_model", no_model)
    monkeypatch.setattr(vad, "vad_available", lambda: False)
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"never read")
    for flag in ("--vad-filter", "--batched"):
        assert cli.main(["transcribe", str(audio), flag, "-o", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith("ostinato: error: --vad-filter")
        assert "needs the optional VAD extra" in lines[0]
        assert "pip install 'ostinato[vad]'" in lines[0]


@pytest.mark.parametrize("channels, out, kernel, stride, padding, bias, length", [
    (1, 258, 256, 128, 0, False, 640),  # the STFT's basis over a window and its context
    (129, 128, 3, 1, 1, True, 4),
    (128, 64, 3, 2, 1, True, 4),
    (64, 64, 3, 2, 1, True, 2),
    (64, 128, 3, 1, 1, True, 1),
])
def test_the_convolutions_as_matrix_products_equal_conv1d(channels, out, kernel, stride, padding, bias, length):
    """On CUDA the VAD's convolutions run as one matrix product each (no cuDNN plan per window count);
    over the shapes silero's network has, they equal ``F.conv1d``."""
    generator = torch.Generator().manual_seed(channels + out)
    x = torch.randn(37, channels, length, generator=generator, dtype=torch.float64)
    weight = torch.randn(out, channels, kernel, generator=generator, dtype=torch.float64)
    b = torch.randn(out, generator=generator, dtype=torch.float64) if bias else None
    expected = torch.nn.functional.conv1d(x, weight, b, stride=stride, padding=padding)
    got = vad._conv1d_by_products(x, weight, b, stride, padding)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)



@needs_torch_vad
def test_prepare_on_loads_the_network_only_where_the_torch_backend_runs(monkeypatch):
    vad._load.cache_clear()
    monkeypatch.setenv("OSTINATO_VAD_BACKEND", "onnx")
    vad.prepare_on("cpu")
    assert vad._load.cache_info().currsize == 0  # onnxruntime's network is not the one prepared
    monkeypatch.setenv("OSTINATO_VAD_BACKEND", "torch")
    vad.prepare_on("cpu")
    assert vad._load.cache_info().currsize == 1
    network = vad.load_vad("cpu")
    assert isinstance(network, vad.TorchSilero) and vad._load.cache_info().hits == 1
    vad._load.cache_clear()
