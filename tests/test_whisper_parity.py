"""Token-for-token parity with faster-whisper on real speech (the embedded tiny.en, CPU, float32).

The references in tests/data/refs were produced by faster-whisper itself (dev/make_whisper_refs.py);
this test needs neither faster-whisper nor a network.
"""
import json

import pytest

from ostinato import WhisperModel
from ostinato.ops import cpu_linear

REFS_FILE = "refs/faster_whisper_tiny_en.json"
# Each reference run's faster-whisper options, as ostinato keyword arguments.
RUN_OPTIONS = {
    "greedy": {},
    "without_timestamps": {"without_timestamps": True},
    "initial_prompt": {"initial_prompt": "Speech synthesis test."},
    "no_condition": {"condition_on_previous_text": False},
}


@pytest.fixture(scope="module")
def refs(data_dir):
    return json.loads((data_dir / REFS_FILE).read_text())


@pytest.fixture(scope="module", params=cpu_linear.LAYOUTS)
def model(tiny_en_path, request):
    """The model with its decode step's weights in each layout (the processor's vendor picks one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cpu_linear.LAYOUT_VARIABLE, request.param)
        cpu_linear._cpu_layout.cache_clear()
        model = WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")
    cpu_linear._cpu_layout.cache_clear()
    weight = model.model.decoder.token_embedding.weight
    assert cpu_linear.is_in_major(weight) == (request.param == "in-major")
    return model


# Every clip with the default options; the other option sets on a spread of clips, to keep CI fast.
VARIANT_CLIPS = ("c02_numbers.flac", "c07_brown5_f2.flac", "c08_story_long.flac", "c11_lead_silence.flac")


def _cases():
    import pathlib

    refs = json.loads((pathlib.Path(__file__).parent / "data" / REFS_FILE).read_text())
    for run in RUN_OPTIONS:
        for clip in refs["runs"][run]:
            if run == "greedy" or clip in VARIANT_CLIPS:
                yield pytest.param(run, clip, id=f"{run}-{clip}")


@pytest.mark.parametrize("run,clip", list(_cases()))
def test_matches_faster_whisper(model, refs, data_dir, run, clip):
    expected = refs["runs"][run][clip]
    assert expected["options"]["beam_size"] == 1 and expected["options"]["temperature"] == 0.0
    segments, info = model.transcribe(str(data_dir / "clips" / clip), beam_size=1, temperature=0.0, **RUN_OPTIONS[run])
    segments = list(segments)
    assert info.language == expected["language"]
    assert info.duration == pytest.approx(expected["duration"], abs=1e-6)
    assert [s.tokens for s in segments] == [s["tokens"] for s in expected["segments"]]
    for got, want in zip(segments, expected["segments"]):
        assert (got.id, got.seek, got.text) == (want["id"], want["seek"], want["text"])
        assert got.start == pytest.approx(want["start"], abs=1e-6)
        assert got.end == pytest.approx(want["end"], abs=1e-6)
        assert got.avg_logprob == pytest.approx(want["avg_logprob"], abs=2e-3)
        assert got.no_speech_prob == pytest.approx(want["no_speech_prob"], abs=2e-3)
        assert got.compression_ratio == pytest.approx(want["compression_ratio"], abs=1e-5)
        assert got.temperature == want["temperature"]


def test_reference_set_is_meaningful(refs):
    """Guard the references themselves: enough clips, real text, silence, multi-segment windows."""
    greedy = refs["runs"]["greedy"]
    spoken = [c for c, r in greedy.items() if r["segments"]]
    assert len(spoken) >= 8
    assert any(not r["segments"] for r in greedy.values())  # silence gives no text
    assert any(len(r["segments"]) > 3 for r in greedy.values())
    for clip in VARIANT_CLIPS:
        assert clip in greedy
    assert max(r["duration"] for r in greedy.values()) > 20
    assert min(r["duration"] for r in greedy.values()) < 3
