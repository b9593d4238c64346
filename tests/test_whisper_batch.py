"""Batched transcription (``transcribe_batch``, ``--batch-size``): every audio's result equals its
transcription alone (which test_whisper_parity / _longform / _beam check against faster-whisper),
rows are refilled while other windows still run, and bad inputs fail per audio."""
import pytest

from ostinato import WhisperModel
from ostinato.cli import main
from ostinato.errors import AudioError, InvalidOptionError
from ostinato.models.whisper import decoding

# Short and long (c17: two windows), speech in noise, and digital silence (skipped undecoded).
CLIPS = ("c01_hello_short.flac", "c17_cut_two_windows.flac", "c05_white20_m3.flac", "c15_silence.flac",
         "c02_numbers.flac")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Decoding-heavy module: run it on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def model(tiny_en_path):
    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


class _Near(float):
    """An average log-probability equal to another within 1e-4: a window in a batch and alone sums the
    same float32 terms, not always in the same order (a fixed rounding would flip at its boundaries)."""

    def __eq__(self, other):
        return abs(float(self) - float(other)) <= 1e-4

    def __ne__(self, other):
        return not self == other

    __hash__ = float.__hash__


def _summary(segments, info):
    segments = list(segments)
    return (
        info.language,
        [(s.seek, s.start, s.end, s.text, s.tokens, s.temperature, _Near(s.avg_logprob)) for s in segments],
        [[(w.start, w.end, w.word) for w in s.words] if s.words else None for s in segments],
    )


def _alone(model, paths, **options):
    return [_summary(*model.transcribe(p, **options)) for p in paths]


def _batched(model, paths, batch_size, **options):
    return [_summary(segments, info) for segments, info in model.transcribe_batch(paths, batch_size=batch_size, **options)]


def test_greedy_batch_equals_alone_with_refills(model, data_dir, monkeypatch):
    paths = [str(data_dir / "clips" / c) for c in CLIPS]
    admissions = []
    admit = decoding.GreedyRun.admit

    def recording(run, jobs):
        admissions.append((run.busy, len(jobs)))
        return admit(run, jobs)

    monkeypatch.setattr(decoding.GreedyRun, "admit", recording)
    batched = _batched(model, paths, 2, beam_size=1)
    assert any(busy for busy, _ in admissions), "no window was admitted while another was running"
    assert sum(n for _, n in admissions) >= len(paths) - 1  # c15 is skipped undecoded
    monkeypatch.setattr(decoding.GreedyRun, "admit", admit)
    assert batched == _alone(model, paths, beam_size=1)
    assert batched[3][1] == []  # digital silence: no text
    assert len({s[0] for s in batched[1][1]}) == 2  # c17's two windows


def test_beam_search_and_word_timestamps_batch_equals_alone(model, data_dir):
    paths = [str(data_dir / "clips" / c) for c in ("c01_hello_short.flac", "c02_numbers.flac")]
    options = dict(beam_size=5, word_timestamps=True)
    assert _batched(model, paths, 2, **options) == _alone(model, paths, **options)


def test_sampling_batch_equals_alone(model, data_dir):
    # Every window samples (best_of 3 at one temperature): a window's draws depend on its own
    # audio's seed only, not on what shares the batch.
    paths = [str(data_dir / "clips" / c) for c in ("c01_hello_short.flac", "c02_numbers.flac", "c04_names_rp.flac")]
    options = dict(beam_size=1, temperature=1.0, best_of=3, seed=5)
    batched = _batched(model, paths, 3, **options)
    assert batched == _alone(model, paths, **options)
    assert _batched(model, paths, 3, **dict(options, seed=6)) != batched  # the seed matters


def test_bad_audio_fails_in_its_place(model, data_dir, tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really")
    good = str(data_dir / "clips" / "c01_hello_short.flac")
    outcomes = model.transcribe_many([good, str(bad), good], batch_size=2, beam_size=1)
    assert isinstance(outcomes[1], AudioError)
    assert _summary(*outcomes[0]) == _summary(*outcomes[2]) == _alone(model, [good], beam_size=1)[0]
    with pytest.raises(AudioError):
        model.transcribe_batch([good, str(tmp_path / "missing.wav")], batch_size=2, beam_size=1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(batch_size=2, on_progress=print), "on_progress"),
        (dict(batch_size=2, beam_sizes=3), "unknown"),
        (dict(batch_size=2, beam_size=0), "beam_size"),
    ],
)
def test_bad_batch_options(model, data_dir, kwargs, match):
    with pytest.raises(InvalidOptionError, match=match):
        model.transcribe_batch([str(data_dir / "clips" / "c01_hello_short.flac")], **kwargs)


def test_one_audio_is_not_a_batch(model, data_dir):
    with pytest.raises(InvalidOptionError, match="list"):
        model.transcribe_batch(str(data_dir / "clips" / "c01_hello_short.flac"))


def test_cli_batch_size_writes_what_one_by_one_writes(tiny_en_path, data_dir, tmp_path, capsys):
    clips = [str(data_dir / "clips" / c) for c in ("c01_hello_short.flac", "c02_numbers.flac")]
    common = ["transcribe", *clips, "--model", str(tiny_en_path), "--device", "cpu", "--beam-size", "1", "-f", "srt", "-q"]
    assert main(common + ["-o", str(tmp_path / "one")]) == 0
    assert main(common + ["-o", str(tmp_path / "batch"), "--batch-size", "2"]) == 0
    for clip in ("c01_hello_short", "c02_numbers"):
        one = (tmp_path / "one" / f"{clip}.srt").read_text()
        assert one and one == (tmp_path / "batch" / f"{clip}.srt").read_text()
    capsys.readouterr()
    assert main(common + ["--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    # A missing file is reported on one line; the others are still written.
    assert main(["transcribe", clips[0], str(tmp_path / "nope.wav"), "--model", str(tiny_en_path), "--device", "cpu",
                 "--beam-size", "1", "-f", "txt", "-q", "-o", str(tmp_path / "mixed"), "--batch-size", "2"]) == 1
    assert (tmp_path / "mixed" / "c01_hello_short.txt").exists()
    assert "nope.wav" in capsys.readouterr().err


def test_a_failure_in_the_scheduler_stops_the_batch_without_hanging(model, data_dir, monkeypatch):
    paths = [str(data_dir / "clips" / c) for c in ("c01_hello_short.flac", "c02_numbers.flac", "c04_names_rp.flac")]

    def broken(mel):
        raise RuntimeError("simulated device failure")

    monkeypatch.setattr(model, "encode", broken)
    with pytest.raises(RuntimeError, match="simulated device failure"):
        model.transcribe_batch(paths, batch_size=2, beam_size=1)
    monkeypatch.undo()
    # The model still works afterwards, batched and alone.
    assert _batched(model, paths[:1], 2, beam_size=1) == _alone(model, paths[:1], beam_size=1)


@pytest.mark.parametrize("options,rows", [
    (dict(beam_size=1, temperature=0.0), 1),  # greedy alone: best_of samples nothing
    (dict(beam_size=1), 5),  # greedy, falling back to best_of=5 samples
    (dict(beam_size=3, best_of=2, temperature=(0.0, 0.5)), 3),
    (dict(beam_size=3, best_of=4, temperature=0.7), 4),  # sampling only: no beams
])
def test_the_state_holds_the_rows_the_options_can_take(model, data_dir, options, rows):
    assert model.options(**options).rows_per_window == rows
    paths = [str(data_dir / "clips" / "c01_hello_short.flac")] * 2
    model.transcribe_batch(paths, batch_size=2, **options)
    assert list(model._batch_decoders) == [(2, 2 * rows)]  # two windows' rows, no more


@pytest.mark.parametrize("count, together, sizes", [
    (16, True, [16]), (13, True, [8, 4, 1]), (6, True, [4, 2]), (5, False, [1, 1, 1, 1, 1]), (0, True, []),
])
def test_prefill_groups_are_powers_of_two_when_rows_are_independent(count, together, sizes):
    assert decoding.prefill_groups(count, together) == sizes


def test_the_cpu_prefills_one_window_per_call(model, data_dir, monkeypatch):
    # plain PyTorch on the CPU may round a row of a batched product differently from the row alone,
    # so windows admitted together still prefill one by one (each result is the one it gets alone)
    calls = []
    original = decoding.WindowDecoder._prefill_heads

    def spy(self, heads, rows, slots, logits_at):
        calls.append(len(heads))
        return original(self, heads, rows, slots, logits_at)

    monkeypatch.setattr(decoding.WindowDecoder, "_prefill_heads", spy)
    clip = str(data_dir / "clips" / "c01_hello_short.flac")
    model.transcribe_batch([clip, clip, clip], batch_size=3, beam_size=1, max_new_tokens=4, initial_prompt=" Hello there.")
    assert calls and set(calls) == {1}
