"""The command line, run in-process against a fake WhisperModel (no weights, no torch work)."""
import io
import os
import subprocess
import sys
import types
from dataclasses import asdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

try:
    from ostinato import cli
except Exception:  # the package __init__ is being edited elsewhere; the CLI does not need it
    _pkg = types.ModuleType("ostinato")
    _pkg.__path__ = [str(SRC / "ostinato")]
    sys.modules["ostinato"] = _pkg
    from ostinato import cli

from ostinato import loading
from ostinato.errors import AudioError, InvalidOptionError, ModelLoadError
from ostinato.models.whisper.options import TranscribeOptions
from ostinato.results import Segment, TranscriptionInfo


def seg(i, start, end, text):
    return Segment(id=i, seek=0, start=start, end=end, text=text, tokens=[1, 2],
                   avg_logprob=-0.2, compression_ratio=1.1, no_speech_prob=0.01)


SEGMENTS = [seg(0, 0.0, 4.0, " Hello there."), seg(1, 4.0, 7.5, " General --> Kenobi.")]


class FakeModel:
    """Stands in for WhisperModel; the input file's name picks the behaviour."""

    created = []

    def __init__(self, model=None, device="auto", compute_type="auto", decode_loop="auto", cpu_threads=0):
        if model == "no/such/model":
            raise ModelLoadError("cannot load model from no/such/model: not a directory")
        self.options = dict(model=model, device=device, compute_type=compute_type, decode_loop=decode_loop,
                            cpu_threads=cpu_threads)
        self.device, self.dtype, self.model_path = device, compute_type, model
        self.calls = []
        FakeModel.created.append(self)

    def transcribe(self, audio, **options):
        self.calls.append((audio, options))
        name = Path(audio).name
        if name.startswith("broken"):
            raise AudioError(f"{audio}: cannot decode: invalid data found\nwhen processing input")
        if name.startswith("interrupt"):
            raise KeyboardInterrupt
        if options.get("language") == "xx":
            raise InvalidOptionError("unknown language 'xx'")

        def segments():
            yield SEGMENTS[0]
            if name.startswith("midway"):  # decoding fails after the first window
                raise AudioError(f"{audio}: truncated stream")
            yield SEGMENTS[1]

        return segments(), TranscriptionInfo(language="en", language_probability=1.0, duration=8.0)

    def transcribe_many(self, audios, batch_size=16, **options):
        """The batched path (--batch-size > 1): one (segments, info) or error per input."""
        outcomes = []
        for audio in audios:
            try:
                segments, info = self.transcribe(audio, **options)
                outcomes.append((list(segments), info))
            except AudioError as exc:
                outcomes.append(exc)
        return outcomes


class NoModel:
    def __init__(self, **_):
        raise AssertionError("the model must not be loaded")


@pytest.fixture
def fake_model(monkeypatch):
    FakeModel.created = []
    monkeypatch.setattr(loading, "load_model", lambda model, **kw: FakeModel(model, **kw))
    return FakeModel


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(loading, "load_model", lambda model, **kw: NoModel(**kw))


@pytest.fixture
def audio(tmp_path):
    def make(name):
        path = tmp_path / "in" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"not really audio; the fake model never reads it")
        return str(path)
    return make


def assert_one_error_line(err, *fragments):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ostinato: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


EXPECTED_STDOUT = "[00:00.000 --> 00:04.000] Hello there.\n[00:04.000 --> 00:07.500] General --> Kenobi.\n"


# --- happy paths --------------------------------------------------------------------------------

def test_transcribe_writes_all_formats(fake_model, audio, tmp_path, capsys):
    out = tmp_path / "out" / "nested"  # created on demand
    rc = cli.main(["transcribe", audio("talk.v1.flac"), "--output-dir", str(out), "--output-format", "all"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out == EXPECTED_STDOUT
    assert captured.err == ""  # stderr is not a terminal and --verbose is off: no progress bar
    assert sorted(p.name for p in out.iterdir()) == [f"talk.v1.{e}" for e in ("json", "srt", "tsv", "txt", "vtt")]
    assert (out / "talk.v1.srt").read_text(encoding="utf-8") == (
        "1\n00:00:00,000 --> 00:00:04,000\nHello there.\n\n"
        "2\n00:00:04,000 --> 00:00:07,500\nGeneral -> Kenobi.\n\n"
    )
    assert (out / "talk.v1.txt").read_text(encoding="utf-8") == "Hello there.\nGeneral --> Kenobi.\n"
    assert (out / "talk.v1.tsv").read_text(encoding="utf-8").splitlines()[1] == "0\t4000\tHello there."


def test_options_reach_the_model(fake_model, audio, tmp_path, capsys):
    rc = cli.main([
        "transcribe", audio("a.wav"), "-o", str(tmp_path), "-f", "txt", "--model", "some/ckpt",
        "--device", "cuda:1", "--compute-type", "float16", "--cpu-threads", "3", "--language", "de", "--task", "translate",
        "--beam-size", "3", "--temperature", "0.4", "--initial-prompt", "Glossary: ostinato.",
        "--without-timestamps", "--no-graphs", "--quiet", "--best-of", "2", "--patience", "1.5",
        "--length-penalty", "0.5", "--no-condition-on-previous-text", "--seed", "7",
        "--clip-timestamps", "1.5,20", "--hotwords", "ostinato", "--prefix", "Hello",
    ])
    assert rc == 0
    assert capsys.readouterr().out == ""  # --quiet
    (model,) = fake_model.created
    assert model.options == dict(model="some/ckpt", device="cuda:1", compute_type="float16", decode_loop="eager",
                                 cpu_threads=3)
    assert model.calls[0][1] == asdict(TranscribeOptions(
        language="de", task="translate", beam_size=3, temperature=0.4,
        initial_prompt="Glossary: ostinato.", without_timestamps=True, best_of=2, patience=1.5,
        length_penalty=0.5, condition_on_previous_text=False, seed=7, clip_timestamps="1.5,20",
        hotwords="ostinato", prefix="Hello",
    ))
    assert [p.name for p in tmp_path.glob("*.txt")] == ["a.txt"]


def test_temperature_schedule(fake_model, audio, tmp_path):
    assert cli.main(["transcribe", audio("a.wav"), "-o", str(tmp_path), "-q", "--temperature", "0,0.5,1"]) == 0
    assert fake_model.created[0].calls[0][1]["temperature"] == (0.0, 0.5, 1.0)


def test_defaults(fake_model, audio, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["transcribe", audio("a.wav")]) == 0
    (model,) = fake_model.created
    assert model.options == dict(model=None, device="auto", compute_type="auto", decode_loop="auto", cpu_threads=0)
    # faster-whisper's defaults: beam search, then sampling at rising temperatures.
    called = model.calls[0][1]
    assert called == asdict(TranscribeOptions())
    assert (called["beam_size"], called["best_of"], called["temperature"]) == (5, 5, (0.0, 0.2, 0.4, 0.6, 0.8, 1.0))
    assert sorted(p.name for p in tmp_path.glob("a.*")) == ["a.json", "a.srt", "a.tsv", "a.txt", "a.vtt"]


def test_verbose_shows_progress_on_stderr(fake_model, audio, tmp_path, capsys):
    rc = cli.main(["transcribe", audio("a.wav"), "-o", str(tmp_path), "-f", "txt", "--verbose"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out == EXPECTED_STDOUT
    assert "8.00/8.00" in captured.err and "100%" in captured.err
    assert "Traceback" not in captured.err


def test_several_files_one_model(fake_model, audio, tmp_path, capsys):
    files = [audio("one.wav"), audio("two.mp3")]
    assert cli.main(["transcribe", *files, "-o", str(tmp_path / "out"), "-f", "srt"]) == 0
    assert len(fake_model.created) == 1  # loaded once, used for every file
    assert [call[0] for call in fake_model.created[0].calls] == files
    # several inputs: each file's segments under its name, as with --batch-size
    assert capsys.readouterr().out == "".join(f"== {f}\n{EXPECTED_STDOUT}" for f in files)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["one.srt", "two.srt"]


def test_one_failing_file_does_not_stop_the_others(fake_model, audio, tmp_path, capsys):
    files = [audio("one.wav"), audio("broken.wav"), audio("three.wav")]
    rc = cli.main(["transcribe", *files, "-o", str(tmp_path / "out"), "-f", "txt"])
    captured = capsys.readouterr()
    assert rc == 1
    assert_one_error_line(captured.err, "broken.wav", "cannot decode")
    assert captured.out == f"== {files[0]}\n{EXPECTED_STDOUT}== {files[2]}\n{EXPECTED_STDOUT}"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["one.txt", "three.txt"]


def test_failure_while_decoding_writes_no_partial_file(fake_model, audio, tmp_path, capsys):
    rc = cli.main(["transcribe", audio("midway.wav"), audio("ok.wav"), "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert rc == 1
    assert_one_error_line(captured.err, "midway.wav", "truncated")
    assert sorted(p.stem for p in (tmp_path / "out").iterdir()) == ["ok"] * 5


# --- error paths --------------------------------------------------------------------------------

def test_missing_file_needs_no_model(no_model, tmp_path, capsys):
    rc = cli.main(["transcribe", str(tmp_path / "nope.wav"), "-o", str(tmp_path)])
    assert rc == 1
    assert_one_error_line(capsys.readouterr().err, "nope.wav", "no such file")


def test_missing_file_among_others(fake_model, audio, tmp_path, capsys):
    rc = cli.main(["transcribe", str(tmp_path / "nope.wav"), audio("ok.wav"), "-o", str(tmp_path), "-f", "txt"])
    captured = capsys.readouterr()
    assert rc == 1
    assert_one_error_line(captured.err, "nope.wav")
    assert captured.out == EXPECTED_STDOUT
    assert (tmp_path / "ok.txt").exists()


def test_directory_as_input(no_model, tmp_path, capsys):
    assert cli.main(["transcribe", str(tmp_path)]) == 1
    assert_one_error_line(capsys.readouterr().err, "directory")


@pytest.mark.parametrize("args, fragment", [
    (["--beam-size", "0"], "--beam-size"),
    (["--beam-size", "two"], "--beam-size"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", ""], "--temperature"),
    (["--temperature", "0,,1"], "--temperature"),
    (["--temperature", "0,-1"], "--temperature"),
    (["--best-of", "0"], "--best-of"),
    (["--patience", "0"], "--patience"),
    (["--patience", "0.05"], "--patience"),
    (["--length-penalty", "inf"], "--length-penalty"),
    (["--seed", "-1"], "--seed"),
    (["--clip-timestamps", "a,b"], "--clip-timestamps"),
    (["--clip-timestamps", "5,2"], "--clip-timestamps"),
    (["--clip-timestamps", "-1"], "--clip-timestamps"),
    (["--output-format", "xml"], "xml"),
    (["--task", "bogus"], "bogus"),
    (["--device", "gpu"], "--device"),
    (["--compute-type", "int8"], "int8"),
    (["--cpu-threads", "-1"], "--cpu-threads"),
    (["--cpu-threads", "two"], "--cpu-threads"),
    (["--language", ""], "--language"),
    (["--verbose", "--quiet"], "--quiet"),
    (["--no-such-flag"], "--no-such-flag"),
])
def test_bad_options_exit_2_before_loading(no_model, audio, capsys, args, fragment):
    # A real file, so only the option is wrong; NoModel proves validation precedes the load.
    rc = cli.main(["transcribe", audio("a.wav"), *args])
    assert rc == 2
    assert_one_error_line(capsys.readouterr().err, fragment)


def test_bad_options_beat_missing_files(no_model, capsys):
    assert cli.main(["transcribe", "nope.wav", "--beam-size", "0"]) == 2
    assert_one_error_line(capsys.readouterr().err, "--beam-size")


def test_bad_model_path(fake_model, audio, tmp_path, capsys):
    rc = cli.main(["transcribe", audio("a.wav"), "--model", "no/such/model", "-o", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1
    assert_one_error_line(captured.err, "no/such/model")
    assert captured.out == ""


def test_option_rejected_by_the_model(fake_model, audio, tmp_path, capsys):
    rc = cli.main(["transcribe", audio("a.wav"), audio("b.wav"), "--language", "xx", "-o", str(tmp_path)])
    assert rc == 2
    assert_one_error_line(capsys.readouterr().err, "xx")
    assert len(fake_model.created[0].calls) == 1  # the same option would fail every file: stop


def test_output_dir_is_a_file(no_model, audio, tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert cli.main(["transcribe", audio("a.wav"), "-o", str(blocker / "sub")]) == 1
    assert_one_error_line(capsys.readouterr().err, "output directory")


def test_keyboard_interrupt(fake_model, audio, tmp_path, capsys):
    assert cli.main(["transcribe", audio("interrupt.wav"), "-o", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["ostinato: interrupted"]


def test_no_command(capsys):
    assert cli.main([]) == 2
    assert_one_error_line(capsys.readouterr().err, "missing command")


def test_no_files(capsys):
    assert cli.main(["transcribe"]) == 2
    assert_one_error_line(capsys.readouterr().err, "FILE")


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ostinato ")


def test_help_in_process(capsys):
    assert cli.main(["transcribe", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--beam-size", "--output-format", "--no-graphs", "--quiet"):
        assert flag in out


def test_python_dash_m_help():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "ostinato", "--help"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: ostinato" in proc.stdout
    assert "transcribe" in proc.stdout


# --- word timestamps and word-level subtitle options ----------------------------------------------

def test_word_options_reach_model_and_writers(fake_model, audio, tmp_path, monkeypatch):
    from ostinato.results import Word

    words = [Word(0.0, 0.5, " Hello", 0.9), Word(0.5, 1.0, " there,", 0.9), Word(1.2, 2.0, " general", 0.8),
             Word(2.0, 3.0, " Kenobi.", 0.7)]
    timed = [Segment(id=1, seek=0, start=0.0, end=3.0, text=" Hello there, general Kenobi.", tokens=[1],
                     avg_logprob=-0.2, compression_ratio=1.1, no_speech_prob=0.01, words=words)] * 2
    monkeypatch.setattr(sys.modules[__name__], "SEGMENTS", timed)
    rc = cli.main(["transcribe", audio("a.wav"), "-o", str(tmp_path), "-f", "srt", "-q", "--word-timestamps",
                   "--hallucination-silence-threshold", "0.5", "--max-line-width", "14", "--max-line-count", "1",
                   "--highlight-words"])
    assert rc == 0
    options = fake_model.created[0].calls[0][1]
    assert options["word_timestamps"] is True and options["hallucination_silence_threshold"] == 0.5
    from ostinato.writers import SubtitleOptions, get_writer

    expected = io.StringIO()
    get_writer("srt").write(timed, None, expected, SubtitleOptions(
        highlight_words=True, max_line_width=14, max_line_count=1))
    srt = (tmp_path / "a.srt").read_text(encoding="utf-8")
    assert srt == expected.getvalue()
    assert srt.startswith("1\n00:00:00,000 --> 00:00:00,500\n<u>Hello</u> there,\n\n")


def test_no_word_options_without_the_flag(fake_model, audio, tmp_path):
    assert cli.main(["transcribe", audio("a.wav"), "-o", str(tmp_path), "-q"]) == 0
    assert fake_model.created[0].calls[0][1]["word_timestamps"] is False


@pytest.mark.parametrize("args, fragment", [
    (["--highlight-words"], "--word-timestamps"),
    (["--max-line-width", "40"], "--word-timestamps"),
    (["--max-line-count", "2"], "--word-timestamps"),
    (["--max-words-per-line", "3"], "--word-timestamps"),
    (["--hallucination-silence-threshold", "1"], "--word-timestamps"),
    (["--word-timestamps", "--max-line-width", "0"], "--max-line-width"),
    (["--word-timestamps", "--max-words-per-line", "-2"], "--max-words-per-line"),
    (["--word-timestamps", "--hallucination-silence-threshold", "-1"], "--hallucination-silence-threshold"),
])
def test_bad_word_options_exit_2_before_loading(no_model, audio, capsys, args, fragment):
    assert cli.main(["transcribe", audio("a.wav"), *args]) == 2
    assert_one_error_line(capsys.readouterr().err, fragment)


def test_whisper_options_are_refused_for_a_transducer_whatever_its_name(no_model, audio, data_dir, tmp_path, capsys):
    """The family comes from the checkpoint's contents: a .nemo archive saved under another name is
    still a transducer, and every Whisper option given to it is named in one line."""
    renamed = tmp_path / "model.bin"
    renamed.write_bytes((data_dir / "transducer" / "tiny_tdt.nemo").read_bytes())
    rc = cli.main(["transcribe", audio("a.wav"), "--model", str(renamed), "--beam-size", "3", "--language", "fr",
                   "--word-timestamps"])
    assert rc == 2
    assert_one_error_line(capsys.readouterr().err, "--beam-size", "--language", "--word-timestamps", "transducer")


# --- what a new user ran into ---------------------------------------------------------------------

def test_inputs_sharing_a_name_keep_every_transcript(fake_model, audio, tmp_path, capsys):
    files = [audio("a.wav"), audio("a.flac"), audio("a.mp3"), audio("b.wav")]
    out = tmp_path / "out"
    assert cli.main(["transcribe", *files, "-o", str(out), "-f", "txt", "-q"]) == 0
    # a shared stem keeps the extension; a name of its own does not
    assert sorted(p.name for p in out.iterdir()) == ["a.flac.txt", "a.mp3.txt", "a.wav.txt", "b.txt"]


def test_the_same_name_in_two_folders_is_refused_before_loading(no_model, audio, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.wav").write_bytes(b"x")
    rc = cli.main(["transcribe", audio("a.wav"), str(other / "a.wav"), "-o", str(tmp_path / "out")])
    assert rc == 2
    assert_one_error_line(capsys.readouterr().err, "a.wav", "--output-dir")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("batch", [[], ["--batch-size", "4"]])
def test_several_files_get_headers_batched_or_not(fake_model, audio, tmp_path, capsys, batch):
    files = [audio("one.wav"), audio("two.wav")]
    assert cli.main(["transcribe", *files, "-o", str(tmp_path), "-f", "txt", *batch]) == 0
    assert capsys.readouterr().out == "".join(f"== {f}\n{EXPECTED_STDOUT}" for f in files)
    assert cli.main(["transcribe", files[0], "-o", str(tmp_path), "-f", "txt", *batch]) == 0
    assert capsys.readouterr().out == EXPECTED_STDOUT  # one file: no header


def test_unwritable_output_dir_fails_before_loading(no_model, audio, tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: make the scratch file fail instead
            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied")
            monkeypatch.setattr(cli.tempfile, "TemporaryFile", refuse)
        rc = cli.main(["transcribe", audio("a.wav"), "-o", str(locked)])
    finally:
        locked.chmod(0o700)
    assert rc == 1
    assert_one_error_line(capsys.readouterr().err, "cannot write to output directory", "Permission denied")
    assert list(locked.iterdir()) == []


def test_output_dir_is_created_before_loading(fake_model, audio, tmp_path):
    out = tmp_path / "new" / "deeper"
    assert cli.main(["transcribe", audio("a.wav"), "-o", str(out), "-f", "txt", "-q"]) == 0
    assert [p.name for p in out.iterdir()] == ["a.txt"]  # and no scratch file left behind


@pytest.fixture
def nemo_named_bin(data_dir, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes((data_dir / "transducer" / "tiny_tdt.nemo").read_bytes())
    return renamed


def test_every_whisper_option_given_to_a_transducer_is_named(no_model, audio, nemo_named_bin, capsys):
    rc = cli.main(["transcribe", audio("a.wav"), "--model", str(nemo_named_bin), "--beam-size", "5",
                   "--language", "fr", "--temperature", "0.5", "--initial-prompt", "Hi", "--task", "translate",
                   "--no-condition-on-previous-text"])
    assert rc == 2
    err = capsys.readouterr().err
    # set explicitly, even to the default value (--beam-size 5), each is named; nothing else is
    assert_one_error_line(err, "--beam-size", "--language", "--temperature", "--initial-prompt", "--task",
                          "--condition-on-previous-text", "NeMo transducer")
    assert "--best-of" not in err and "--seed" not in err


def test_a_transducer_without_whisper_options_transcribes(data_dir, nemo_named_bin, tmp_path, capsys):
    clip = data_dir / "clips" / "c01_hello_short.flac"
    rc = cli.main(["transcribe", str(clip), "--model", str(nemo_named_bin), "--device", "cpu", "-o", str(tmp_path),
                   "-f", "txt", "-v"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert (tmp_path / "c01_hello_short.txt").exists()
    # -v: what was chosen, on one line
    assert f"ostinato: NeMo transducer model {nemo_named_bin} on cpu, float32; decode loop: " in captured.err


def test_translate_on_an_english_only_model_warns(tiny_en_path, data_dir, tmp_path, capsys, one_torch_thread):
    clip = data_dir / "clips" / "c01_hello_short.flac"
    rc = cli.main(["transcribe", str(clip), "--model", str(tiny_en_path), "--device", "cpu", "--task", "translate",
                   "--beam-size", "1", "-o", str(tmp_path), "-f", "txt"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.err.splitlines() == [
        "ostinato: warning: model is English-only and cannot translate; transcribing instead"]
    assert "Hello" in (tmp_path / "c01_hello_short.txt").read_text(encoding="utf-8")


def test_half_precision_on_the_cpu_falls_back_and_verbose_says_what_was_chosen(
        tiny_en_path, data_dir, tmp_path, capsys, one_torch_thread):
    clip = data_dir / "clips" / "c01_hello_short.flac"
    import torch

    rc = cli.main(["transcribe", str(clip), "--model", str(tiny_en_path), "--device", "cpu", "--compute-type",
                   "float16", "--beam-size", "1", "--cpu-threads", "1", "-o", str(tmp_path), "-f", "txt", "-v"])
    err = capsys.readouterr().err
    assert rc == 0
    assert torch.get_num_threads() == 1  # --cpu-threads
    lines = err.splitlines()
    assert "ostinato: warning: compute type float16 is not efficient on the CPU: computing in float32 instead" in lines
    # -v: the model, device, dtype, decode rung and threads on one line, and no other line about them
    chosen = [line for line in lines if line.startswith("ostinato: Whisper model ")]
    assert len(chosen) == 1 and chosen[0].startswith(f"ostinato: Whisper model {tiny_en_path} on cpu, float32; "
                                                     "decode loop: eager"), err
    assert "; CPU threads: 1; step weights " in chosen[0]
    layout, rest = chosen[0].rsplit("; step weights ", 1)[1].split(", MKL strict reproducibility ")
    mode, lone = rest.split(", a lone row ")
    assert layout in ("in-major", "out-major")  # which: tests/test_load_model.py holds it to the weights
    assert mode == "on" or mode.startswith("off (")
    assert lone in ("on the one-row kernel", "as among others", "as among others (OSTINATO_CPU_BATCH_INVARIANT=1)")
    assert not [line for line in lines if "decode loop" in line and line not in chosen], err
    assert "Traceback" not in err


def test_model_path_must_not_be_empty(no_model, audio, capsys):
    assert cli.main(["transcribe", audio("a.wav"), "--model", " "]) == 2
    assert_one_error_line(capsys.readouterr().err, "--model", "empty")


def test_choices_agree_with_the_runtime():
    # the command line repeats the runtime's names only so that --help needs no torch
    from ostinato.runtime import DECODE_LOOPS
    from ostinato.runtime.device import _DTYPES

    assert cli.DECODE_LOOPS == DECODE_LOOPS
    assert cli.COMPUTE_TYPES == ("auto", *_DTYPES)
