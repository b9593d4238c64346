"""Beam search and sampling on CUDA: graph replay vs eager, GPU vs CPU, and faster-whisper's tokens.

Uses the same inputs as test_whisper_gpu.py (the random checkpoint, and the real tiny.en with the
clips, pre-decoded through OSTINATO_CLIP_SAMPLES where the device has no PyAV).
"""
import json

import pytest

from ostinato import WhisperModel
from ostinato.runtime import device_loop

from test_whisper_gpu import RANDOM_CKPT, clip_samples, noise

pytestmark = pytest.mark.gpu

BEAM = dict(beam_size=5, temperature=0.0)


def tokens_of(model, audio, **options):
    segments, _ = model.transcribe(audio, **options)
    return [s.tokens for s in segments]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("timestamps", [True, False])
def test_random_model_beam_graph_equals_eager(data_dir, dtype, timestamps):
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type=dtype, use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type=dtype, use_graphs=True)
    for seed, seconds in ((0, 3.0), (1, 17.5)):
        opts = dict(BEAM, without_timestamps=not timestamps, max_new_tokens=50, patience=2.0,
                    repetition_penalty=1.1, no_repeat_ngram_size=3)
        assert tokens_of(graph, noise(seconds, seed), **opts) == tokens_of(eager, noise(seconds, seed), **opts)
    keys = graph.decoder.beam.graph.captured_keys()
    assert keys and all(graph.decoder.beam.graph.mode(k) == "graph" for k in keys)


def test_beam_search_runs_on_the_device_loop_and_batches_as_one_by_one(data_dir):
    """Where the device loop exists, beam search runs on it: one graph for every cache length (the
    reorder bounded on the device), launched until a window finishes. Audios batched (windows of
    different lengths finishing at different steps, their beams refilled by the next windows) get
    the tokens each gets alone on the eager path."""
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type="float16", use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type="float16")
    audios = [noise(s, seed=60 + i) for i, s in enumerate((41.0, 3.0, 12.5, 67.0, 6.0))]
    opts = dict(BEAM, max_new_tokens=60, without_timestamps=False)
    alone = [tokens_of(eager, audio, **opts) for audio in audios]
    batched = graph.transcribe_batch(audios, batch_size=3, **opts)
    assert [[s.tokens for s in segments] for segments, _ in batched] == alone
    assert [tokens_of(graph, audio, **opts) for audio in audios[:2]] == alone[:2]
    beam_graph = graph.decoder.beam.graph
    if device_loop.unavailable_reason("cuda") is None:
        keys = beam_graph.captured_keys()
        assert len({k.filled for k in keys}) == 1 and all(beam_graph.rung(k) == "device loop" for k in keys)


def test_random_model_beam_cpu_equals_gpu_float32(data_dir):
    path = str(data_dir / RANDOM_CKPT)
    cpu = WhisperModel(path, device="cpu", compute_type="float32")
    gpu = WhisperModel(path, device="cuda", compute_type="float32")
    opts = dict(BEAM, max_new_tokens=40)
    for seed, seconds in ((2, 5.0), (3, 29.0)):
        assert tokens_of(gpu, noise(seconds, seed), **opts) == tokens_of(cpu, noise(seconds, seed), **opts)


def test_sampling_graph_equals_eager_and_repeats(data_dir):
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type="float32", use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type="float32", use_graphs=True)
    opts = dict(temperature=(0.5, 1.0), best_of=3, max_new_tokens=30, without_timestamps=True)
    audio = noise(6.0, 4)
    first = tokens_of(graph, audio, seed=11, **opts)
    assert first == tokens_of(graph, audio, seed=11, **opts)
    assert first == tokens_of(eager, audio, seed=11, **opts)
    assert any(tokens_of(graph, audio, seed=s, **opts) != first for s in (12, 13, 14))
    # Sampling noise is a hash of row seeds and steps, not a generator: the step always captures.
    keys = graph.decoder.sample_graph.captured_keys()
    assert keys and all(graph.decoder.sample_graph.mode(k) == "graph" for k in keys)


def test_beam_state_stays_put(data_dir):
    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    tokens_of(model, noise(5.0), **BEAM, max_new_tokens=40)
    addresses = model.decoder.state.addresses()
    tokens_of(model, noise(8.0, 3), **BEAM, max_new_tokens=40)
    assert model.decoder.state.addresses() == addresses
    assert any(name.startswith("beam_") for name in addresses)


@pytest.fixture(scope="module")
def tiny_models(tiny_en_path):
    cpu = WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")
    gpu = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float32", use_graphs=True)
    return cpu, gpu


@pytest.mark.parametrize("clip", ["c02_numbers", "c08_story_long", "c17_cut_two_windows", "c18_long_lecture"])
def test_tiny_en_default_options_gpu_graph(tiny_models, data_dir, clip):
    # faster-whisper's defaults; these clips never fall back to sampling, so the tokens are the
    # reference's exactly, on the GPU graph path as on the CPU.
    cpu, gpu = tiny_models
    audio = clip_samples(data_dir, clip)
    refs = json.loads((data_dir / "refs" / "faster_whisper_tiny_en_decoding.json").read_text())
    reference = refs["runs"]["default"][f"{clip}.flac"]
    assert all(w["temperature"] == 0.0 for w in reference["windows"])
    got = tokens_of(gpu, audio)
    assert got == [s["tokens"] for s in reference["segments"]]
    if clip != "c18_long_lecture":  # the CPU run of the long clip is covered by the CPU tests
        assert got == tokens_of(cpu, audio)
    assert all(gpu.decoder.beam.graph.mode(k) == "graph" for k in gpu.decoder.beam.graph.captured_keys())


def test_tiny_en_long_greedy_gpu_graph(tiny_models, data_dir):
    _, gpu = tiny_models
    refs = json.loads((data_dir / "refs" / "faster_whisper_tiny_en_decoding.json").read_text())
    reference = refs["runs"]["greedy_longform"]["c19_long_noisy_f4.flac"]
    got = tokens_of(gpu, clip_samples(data_dir, "c19_long_noisy_f4"), beam_size=1, temperature=0.0)
    assert got == [s["tokens"] for s in reference["segments"]]
