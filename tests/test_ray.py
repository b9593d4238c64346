"""ostinato.ray.Transcriber: called directly on batches (no Ray), and as a Ray Data stage on a local
cluster; every row's tokens equal ``transcribe``'s for that file, a corrupt file fails alone."""
import shutil

import numpy as np
import pytest

from ostinato import TransducerModel, WhisperModel
from ostinato.errors import InvalidOptionError
from ostinato.ray import Transcriber

CLIPS = ("c01_hello_short.flac", "c02_numbers.flac", "c05_white20_m3.flac")
GREEDY = dict(beam_size=1, best_of=1, temperature=0.0)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Decoding-heavy module: run it on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory, data_dir):
    """Three clips and a corrupt file."""
    path = tmp_path_factory.mktemp("audio")
    for clip in CLIPS:
        shutil.copy(data_dir / "clips" / clip, path / clip)
    (path / "broken.wav").write_bytes(b"RIFF not really a wave file")
    return path


@pytest.fixture(scope="module")
def whisper(tiny_en_path):
    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


@pytest.fixture(scope="module")
def expected(whisper, folder):
    """Each clip's tokens and text from ``transcribe`` alone: the reference every path must equal."""
    out = {}
    for clip in CLIPS:
        segments, info = whisper.transcribe(str(folder / clip), **GREEDY)
        segments = list(segments)
        out[clip] = ([list(s.tokens) for s in segments], "".join(s.text for s in segments).strip(), info.duration)
    return out


@pytest.fixture(scope="module")
def transcriber(tiny_en_path):
    return Transcriber(str(tiny_en_path), device="cpu", compute_type="float32", batch_size=2, **GREEDY)


def _check_rows(rows, expected):
    for row in rows:
        name = str(row["path"]).rsplit("/", 1)[-1]
        if name == "broken.wav":
            assert row["error"] and "\n" not in row["error"]
            assert row["text"] == "" and list(row["segments"]) == [] and row["duration"] is None
            continue
        tokens, text, duration = expected[name]
        assert row["error"] is None, row["error"]
        assert [list(s["tokens"]) for s in row["segments"]] == tokens, name
        assert row["text"] == text and row["language"] == "en"
        assert row["duration"] == pytest.approx(duration)


def test_a_batch_of_paths_and_of_bytes(transcriber, folder, expected):
    paths = sorted(str(p) for p in folder.iterdir())
    out = transcriber({"path": np.array(paths, dtype=object)})
    rows = [{name: out[name][i] for name in out} for i in range(len(paths))]
    assert len(rows) == 4
    _check_rows(rows, expected)
    data = np.empty(len(paths), dtype=object)
    data[:] = [open(p, "rb").read() for p in paths]
    out = transcriber({"bytes": data, "path": np.array(paths, dtype=object)})
    assert "bytes" not in out  # the audio is not carried on
    _check_rows([{name: out[name][i] for name in out} for i in range(len(paths))], expected)


def test_a_dataframe_of_audio_arrays(transcriber, folder, expected, whisper):
    pd = pytest.importorskip("pandas")
    from ostinato.audio import load_audio

    frame = pd.DataFrame({"path": [str(folder / c) for c in CLIPS], "audio": [load_audio(str(folder / c)) for c in CLIPS]})
    out = transcriber(frame)
    assert list(out.columns) == ["path", "text", "language", "duration", "segments", "error"]
    _check_rows(out.to_dict("records"), expected)


def test_a_transducer_through_the_same_class(data_dir, folder):
    path = data_dir / "transducer" / "tiny_tdt.nemo"
    stage = Transcriber(str(path), device="cpu", batch_size=2, max_symbols=5)
    paths = sorted(str(p) for p in folder.iterdir())
    out = stage({"path": np.array(paths, dtype=object)})
    model = TransducerModel(path, device="cpu")
    for i, p in enumerate(paths):
        if p.endswith("broken.wav"):
            assert out["error"][i] and out["text"][i] == ""
            continue
        alone = model.transcribe(p, max_symbols=5)
        assert out["error"][i] is None and out["text"][i] == alone.text
        assert [t for s in out["segments"][i] for t in s["tokens"]] == alone.tokens
    with pytest.raises(InvalidOptionError, match="max_symbols only"):
        Transcriber(str(path), device="cpu", beam_size=5)


def test_batched_reaches_the_stage(folder, whisper, tiny_en_path):
    """batched=True: every audio of the batch is cut into VAD chunks decoded together, each with
    transcribe(batched=True)'s tokens and times."""
    from ostinato.audio.vad import onnx_available

    if not onnx_available():
        pytest.skip("the VAD extra is not installed")
    stage = Transcriber(str(tiny_en_path), device="cpu", compute_type="float32", batch_size=4, batched=True,
                        **GREEDY)
    paths = [str(folder / clip) for clip in CLIPS]
    out = stage({"path": np.array(paths, dtype=object)})
    for i, path in enumerate(paths):
        segments, _ = whisper.transcribe(path, batched=True, **GREEDY)
        segments = list(segments)
        assert out["error"][i] is None
        assert [list(s["tokens"]) for s in out["segments"][i]] == [list(s.tokens) for s in segments]
        assert [(s["start"], s["end"]) for s in out["segments"][i]] == [(s.start, s.end) for s in segments]


def test_bad_batches_and_options(transcriber, tiny_en_path):
    with pytest.raises(InvalidOptionError, match="one of the columns"):
        transcriber({"text": np.array(["hello"], dtype=object)})
    with pytest.raises(InvalidOptionError):
        Transcriber(str(tiny_en_path), device="cpu", beam_size=0)
    with pytest.raises(InvalidOptionError):
        Transcriber(str(tiny_en_path), device="cpu", batch_size=0)


def test_on_a_local_ray_cluster(folder, expected, tiny_en_path, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        ds = ray.data.read_binary_files(str(folder), include_paths=True)
        ds = ds.map_batches(Transcriber, batch_size=3, concurrency=1,
                            fn_constructor_kwargs=dict(model=str(tiny_en_path), device="cpu",
                                                       compute_type="float32", batch_size=2, **GREEDY))
        rows = ds.take_all()
        assert sorted(str(r["path"]).rsplit("/", 1)[-1] for r in rows) == sorted(list(CLIPS) + ["broken.wav"])
        _check_rows(rows, expected)
        # the example script: a folder in, parquet out, on the same cluster
        import runpy
        import sys

        out = tmp_path / "parquet"
        argv = sys.argv
        sys.argv = ["ray_transcribe.py", str(folder), str(out), "--model", str(tiny_en_path), "--batch-size", "4",
                    "--option", "beam_size=1", "--option", "best_of=1", "--option", "temperature=0.0"]
        try:
            with pytest.raises(SystemExit) as done:
                runpy.run_path(_example(), run_name="__main__")
            assert done.value.code == 0
        finally:
            sys.argv = argv
        written = ray.data.read_parquet(str(out)).take_all()
        assert len(written) == 4
        _check_rows(written, expected)
        # a transducer through the same stage
        nemo = _data() / "transducer" / "tiny_tdt.nemo"
        ds = ray.data.read_binary_files(str(folder), include_paths=True).map_batches(
            Transcriber, batch_size=4, concurrency=1,
            fn_constructor_kwargs=dict(model=str(nemo), device="cpu", batch_size=2, max_symbols=5))
        model = TransducerModel(nemo, device="cpu")
        for row in ds.take_all():
            if str(row["path"]).endswith("broken.wav"):
                assert row["error"] and row["text"] == ""
            else:
                assert row["error"] is None and row["text"] == model.transcribe(str(row["path"]), max_symbols=5).text
    finally:
        ray.shutdown()


def _example() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "examples" / "ray_transcribe.py")


def _data():
    from pathlib import Path

    return Path(__file__).resolve().parent / "data"
