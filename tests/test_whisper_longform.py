"""Long-form transcription (several 30-s windows) against faster-whisper 1.2.1's sequential loop.

The clips c17 (two windows), c18 (74 s: two parts and a pause) and c19 (95 s: a noisy,
band-limited phone call in three parts) run through the window loop with faster-whisper's
options, and every window's decode and the final segments must match its references (see
test_whisper_beam.py and decoding_replay.py for how the comparison works). Greedy decoding keeps
the CPU time of the longer runs down; beam search over several windows runs on c17.
"""
import pytest

from decoding_replay import Replay, assert_matches, load_refs, ostinato_options, run_replayed
from ostinato import WhisperModel

REFS = load_refs()
CASES = (
    ("greedy_longform", "c17_cut_two_windows.flac"),
    ("greedy_longform", "c19_long_noisy_f4.flac"),
    ("default", "c17_cut_two_windows.flac"),  # beam search and conditioning across windows
    ("default", "c18_long_lecture.flac"),  # faster-whisper's defaults on the two clips over 60 s
    ("default", "c19_long_noisy_f4.flac"),
    ("no_condition_longform", "c18_long_lecture.flac"),
    ("clip_timestamps_greedy", "c18_long_lecture.flac"),  # two clips, the last open-ended
    ("prefix_greedy_longform", "c18_long_lecture.flac"),  # the prefix applies to the first window only
    ("hotwords_greedy_longform", "c18_long_lecture.flac"),  # hotwords before every window's history
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Decoding-heavy module: run it on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def model(tiny_en_path):
    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


@pytest.mark.parametrize("run, clip", CASES, ids=[f"{r}-{c[:3]}" for r, c in CASES])
def test_matches_faster_whisper(model, data_dir, monkeypatch, run, clip):
    reference = REFS["runs"][run][clip]
    segments, replay = run_replayed(model, monkeypatch, str(data_dir / "clips" / clip), reference)
    assert len(reference["windows"]) >= 2
    assert_matches(segments, replay, reference)


def test_long_references_are_long():
    runs = REFS["runs"]
    assert runs["default"]["c18_long_lecture.flac"]["duration"] > 60
    assert runs["default"]["c19_long_noisy_f4.flac"]["duration"] > 90
    assert len(runs["greedy_longform"]["c19_long_noisy_f4.flac"]["windows"]) >= 4
    clipped = runs["clip_timestamps_greedy"]["c18_long_lecture.flac"]
    assert {s["seek"] for s in clipped["segments"]} >= {450, 4000}  # both clips were decoded
    assert all(s["start"] >= 4.5 for s in clipped["segments"])


def test_segments_stream_as_windows_finish(model, data_dir, monkeypatch):
    # The first window's segments arrive before the second window is decoded, and the progress
    # callback follows the decoded audio time up to the end.
    reference = REFS["runs"]["greedy_longform"]["c17_cut_two_windows.flac"]
    replay = Replay(model, reference["calls"])
    monkeypatch.setattr(model, "decode", replay.decode)
    progress = []
    segments, info = model.transcribe(str(data_dir / "clips" / "c17_cut_two_windows.flac"),
                                      on_progress=progress.append, **ostinato_options(reference["options"]))
    assert replay.position == 0  # nothing decoded before the generator is consumed
    first = next(segments)
    assert replay.position == 1 and first.seek == 0
    rest = list(segments)
    assert replay.position == 2 and rest[-1].seek > 0
    assert progress == sorted(progress) and len(progress) == 2
    assert progress[-1] == pytest.approx(info.duration, abs=0.02)
