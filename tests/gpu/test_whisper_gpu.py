"""Whisper on CUDA: graph path vs eager path, CPU vs GPU, one copy of weights, device memory report.

The device machine has no PyAV, so the clips can also come pre-decoded: OSTINATO_CLIP_SAMPLES names
a folder of `<clip stem>.npy` int16 arrays (16 kHz; dev/export_device_bundle.py writes them), which
are exactly the samples load_audio returns times 32768.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato import WhisperModel
from ostinato.models.whisper.decoding import (
    LONG_HEAD_TOKENS, PER_WINDOW, PREFILL_GRAPH_TOKENS, CrossKey, GreedyKey, PrefillKey,
)
from ostinato.runtime import device_loop, duplicated_parameters

pytestmark = pytest.mark.gpu

RANDOM_CKPT = "checkpoints/huggingface"  # carries its tokenizer.json (the device has no embedded model)
# Spread over voices, noise, silence and both lengths of window.
CLIPS = (
    "c01_hello_short", "c02_numbers", "c05_white20_m3", "c07_brown5_f2", "c08_story_long",
    "c09_fast_caribbean", "c11_lead_silence", "c13_nyc_white15", "c15_silence", "c17_cut_two_windows",
)


def clip_samples(data_dir: Path, stem: str) -> np.ndarray:
    folder = os.environ.get("OSTINATO_CLIP_SAMPLES")
    if folder:
        return np.load(Path(folder) / f"{stem}.npy").astype(np.float32) / 32768.0
    pytest.importorskip("av")
    from ostinato.audio import load_audio

    return load_audio(str(data_dir / "clips" / f"{stem}.flac"))


def tokens_of(model, audio, **options):
    segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, **options)
    return [s.tokens for s in segments]


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return (0.1 * gen.standard_normal(int(seconds * 16000))).astype(np.float32)


def test_encoder_and_admission_graphs_give_the_eager_bits(data_dir):
    # one window's encoder pass, its cross-attention K/V write and its prompt head's prefill replay
    # graphs: the same bits as the model without graphs, call after call (inputs rebound, results copied)
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type="float16", use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type="float16")
    mels = [graph.features(noise(31.0, seed))[None, :, :3000] for seed in (0, 1, 2)]
    encoded = [graph.encode(mel) for mel in mels]
    for mel, got in zip(mels, encoded):
        assert torch.equal(got, eager.encode(mel))
    # batched=True's chunks in one call: each window the bits it has alone, replaying the one graph
    assert torch.equal(graph.encode(torch.cat(mels)), torch.cat(encoded))
    assert torch.equal(eager.encode(torch.cat(mels)), torch.cat(encoded))
    assert graph._encoder_graph.captured_keys() == [tuple(mels[0].shape)]
    assert not torch.equal(encoded[0], encoded[1])  # each result its own copy
    for seed in (3, 4):
        audio = noise(20.0, seed)
        opts = dict(without_timestamps=True, max_new_tokens=20)  # a one-token prompt head: [sot]
        assert tokens_of(graph, audio, **opts) == tokens_of(eager, audio, **opts)
        long_prompt = dict(opts, initial_prompt=" one two three four five six seven eight nine ten")
        assert tokens_of(graph, audio, **long_prompt) == tokens_of(eager, audio, **long_prompt)
    decoder = graph.decoder
    assert decoder._cross_graph.captured_keys() == [CrossKey()]
    # the long prompt's head ran eagerly: this checkpoint's heads are too small for the fused operators,
    # which padding long heads to one graph needs (test_long_heads_of_every_length_replay_one_prefill_graph)
    assert decoder._prefill_graph.captured_keys() == [PrefillKey(1, 1, 0)]


@pytest.fixture(scope="module")
def random_tiny_checkpoint(tmp_path_factory):
    """Random weights in tiny's shapes (the fused operators' head size), as an OpenAI .pt."""
    from ostinato.testing.random_models import save_random_whisper_checkpoint

    return save_random_whisper_checkpoint("tiny", tmp_path_factory.mktemp("random_tiny") / "tiny.pt")


def test_long_heads_of_every_length_replay_one_prefill_graph(random_tiny_checkpoint):
    """Windows whose prompt is the previous text (a long recording's every later window, an initial
    prompt) have heads of many lengths: padded, they replay one graph per number of windows admitted
    together, with the eager model's tokens (heads at their own length), one audio at a time and
    batched."""
    path = random_tiny_checkpoint
    eager = WhisperModel(path, device="cuda", compute_type="float16", use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type="float16")
    audios = [noise(s, seed=70 + i) for i, s in enumerate((95.0, 64.0, 12.0, 150.0))]
    opts = dict(beam_size=1, temperature=0.0, max_new_tokens=30)  # previous text as prompt (the default)
    prompts = (None, " one two three four five six seven eight nine ten eleven twelve thirteen")
    for prompt in prompts:
        want = [tokens_of(eager, audio, initial_prompt=prompt, max_new_tokens=30) for audio in audios]
        assert [tokens_of(graph, audio, initial_prompt=prompt, max_new_tokens=30) for audio in audios] == want
        batched = graph.transcribe_batch(audios, batch_size=3, initial_prompt=prompt, **opts)
        assert [[s.tokens for s in segments] for segments, _ in batched] == want
    for decoder in (graph.decoder, *graph._batch_decoders.values()):
        keys = decoder._prefill_graph.captured_keys()
        long = [k for k in keys if k.tokens > PREFILL_GRAPH_TOKENS]
        assert long and all(k.tokens == LONG_HEAD_TOKENS and k.logits_at == PER_WINDOW for k in long), keys


def test_windows_ending_on_the_context_s_last_position_stay_in_bounds(random_tiny_checkpoint):
    """Rows whose window runs to the last position of the text context (a 225-token head, 223 steps,
    end-of-text suppressed) while other rows go on: the finished rows are stepped on until the loop
    looks, and must not read or write past the caches (before the fix: an out-of-bounds index assert
    or an illegal memory access). The device loop (8 steps a trip) gives the eager model's tokens."""
    from ostinato.models.whisper.decoding import WindowDecoder
    from ostinato.models.whisper.search import WindowRequest

    model = WhisperModel(random_tiny_checkpoint, device="cuda", compute_type="float16")
    tok = model.tokenizer
    n_ctx = model.dims.n_text_ctx
    long_prompt = [tok.sot_prev, *([tok.encode(" so")[0]] * 223), tok.sot, tok.no_timestamps]
    requests = [WindowRequest(long_prompt, False, 50, n_ctx - (len(long_prompt) - 1)),
                WindowRequest([tok.sot, tok.no_timestamps], False, 50, 224),
                WindowRequest(long_prompt, False, 50, 100)]
    features = torch.cat([model.encode(model.features(noise(30.0, seed=90 + i))[None, :, :3000]) for i in range(3)])
    results, decoders = {}, {}
    for name in ("eager", "graph"):
        decoder = decoders[name] = WindowDecoder(model.model, tok, model.device, use_graphs=name == "graph",
                                                 buckets=(4,))
        with torch.inference_mode():
            out = decoder.decode(features, requests, [tok.eot], [])
        torch.cuda.synchronize()
        results[name] = [r.tokens for r in out]
        assert int(decoder.state["position"].max()) <= n_ctx - 1
    assert [len(t) for t in results["graph"]] == [223, 224, 100]
    assert results["graph"] == results["eager"]
    looping = device_loop.unavailable_reason("cuda") is None
    assert decoders["graph"].graph.rung(GreedyKey(4)) == ("device loop" if looping else "K steps per replay")


def test_prefill_graphs_serve_every_row_and_slot(data_dir):
    # every window of a batch has the prompt head [sot] (no previous text): rows and slots are the
    # prefill graph's inputs, so one capture per number of windows admitted together (powers of
    # two) serves them all, with the eager model's tokens
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type="float16", use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type="float16")
    audios = [noise(6.0 + 3 * i, seed=20 + i) for i in range(6)]
    opts = dict(beam_size=1, temperature=0.0, without_timestamps=True, max_new_tokens=12,
                condition_on_previous_text=False)
    got = graph.transcribe_batch(audios, batch_size=4, **opts)
    want = eager.transcribe_batch(audios, batch_size=4, **opts)
    tokens = lambda results: [[s.tokens for s in segments] for segments, _ in results]  # noqa: E731
    assert tokens(got) == tokens(want)
    (decoder,) = graph._batch_decoders.values()
    keys = decoder._prefill_graph.captured_keys()
    assert keys and all(k.tokens == 1 and k.logits_at == 0 and k.windows & (k.windows - 1) == 0 for k in keys), keys


def test_engine_admitting_while_rows_step_gives_each_audio_its_own_result(data_dir):
    """A server's engine on CUDA: audios arrive while others decode, so windows are admitted while
    an advance runs (prefill queued behind it, the advance cut short) and encoded on a side stream
    beside the steps. Each audio gets the tokens it gets alone (the one-audio decoder, no engine)."""
    import threading
    import time

    from ostinato.runtime import scheduler

    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    audios = [noise(s, seed=40 + i) for i, s in enumerate((95.0, 4.0, 61.0, 7.5, 3.0, 33.0, 12.0, 5.0))]
    opts = dict(beam_size=1, best_of=1, temperature=0.0, max_new_tokens=40)
    alone = [tokens_of(model, audio, max_new_tokens=40) for audio in audios]
    during = []
    original = scheduler.RowScheduler.admit

    def counting(self, while_advancing=False):
        admitted = original(self, while_advancing)
        if while_advancing:
            during.append(admitted)
        return admitted

    scheduler.RowScheduler.admit = counting
    try:
        engine = model.engine(batch_size=4, max_search=1)
        engine.start()
        jobs, lock = [None] * len(audios), threading.Lock()

        def send(i):
            time.sleep(0.02 * i)  # arrivals spread over the first windows' steps
            job = engine.submit(audios[i], model.options(**opts))
            with lock:
                jobs[i] = job

        senders = [threading.Thread(target=send, args=(i,)) for i in range(len(audios))]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        results = [job.result(timeout=300) for job in jobs]
        engine.shutdown()
    finally:
        scheduler.RowScheduler.admit = original
    assert [[s.tokens for s in segments] for segments, _ in results] == alone
    assert sum(during) > 0  # some windows were admitted while the rows stepped


def test_a_lone_audio_on_an_engine_steps_its_own_rows(data_dir):
    """An engine of four rows captures its run's graph (four rows) when the run opens; the first
    time a lone audio comes to rows none of which is in use, the four-row graph steps it and the
    one-row graph is captured in the engine's spare time (or, had there been none, the second time);
    the next lone audio's advances replay the one-row graph (fewer masked rows stepped), and its
    tokens are the ones it gets alone. Three audios at once then replay the four-row graph, and get
    their own tokens too."""
    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    opts = dict(beam_size=1, best_of=1, temperature=0.0, max_new_tokens=40)
    audios = [noise(s, seed=60 + i) for i, s in enumerate((4.0, 45.0, 6.0, 3.0))]
    alone = [tokens_of(model, audio, max_new_tokens=40) for audio in audios]
    engine = model.engine(batch_size=4, max_search=1)
    graph = engine._decoder.graph
    replayed = []
    original = type(graph).__call__

    def recording(self, key, **inputs):
        if self is graph:
            replayed.append(key.rows)
        return original(self, key, **inputs)

    type(graph).__call__ = recording
    try:
        engine.start()
        met_once = engine.submit(audios[0], model.options(**opts)).result(timeout=300)
        once = list(replayed)
        first = engine.submit(audios[0], model.options(**opts)).result(timeout=300)
        lone = replayed[len(once):]
        replayed[:] = lone
        rest = [engine.submit(a, model.options(**opts)) for a in audios[1:]]
        results = [first] + [job.result(timeout=300) for job in rest]
        engine.shutdown()
    finally:
        type(graph).__call__ = original
    assert [[s.tokens for s in segments] for segments, _ in results] == alone
    assert [s.tokens for s in met_once[0]] == alone[0]
    assert {key.rows for key in graph.captured_keys() if isinstance(key, GreedyKey)} >= {1, 4}
    assert once and set(once) == {4}
    assert lone and set(lone) == {1}
    assert 4 in replayed[len(lone):]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("timestamps", [True, False])
def test_random_model_graph_equals_eager(data_dir, dtype, timestamps):
    path = str(data_dir / RANDOM_CKPT)
    eager = WhisperModel(path, device="cuda", compute_type=dtype, use_graphs=False)
    graph = WhisperModel(path, device="cuda", compute_type=dtype, use_graphs=True)
    for seed, seconds in ((0, 3.0), (1, 17.5), (2, 29.9)):
        audio = noise(seconds, seed)
        opts = dict(without_timestamps=not timestamps, max_new_tokens=60)
        want = tokens_of(eager, audio, **opts)
        got = tokens_of(graph, audio, **opts)
        assert got == want
    assert graph.decoder.graph.mode(GreedyKey(1)) == "graph"
    assert eager.decoder.graph.mode(GreedyKey(1)) == "eager"
    looping = device_loop.unavailable_reason("cuda") is None
    assert graph.decoder.graph.rung(GreedyKey(1)) == ("device loop" if looping else "K steps per replay")
    assert graph.decoder.loop_rung.startswith("device while-loop" if looping else "8 unrolled steps")


def test_graph_captured_once_and_state_stays_put(data_dir):
    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    addresses = model.decoder.state.addresses()
    calls = {"n": 0}
    step = model.decoder.graph.step

    def counting(*args, **kwargs):
        calls["n"] += 1
        return step(*args, **kwargs)

    model.decoder.graph.step = counting
    tokens_of(model, noise(5.0), max_new_tokens=40)
    first = calls["n"]
    # The capture only: the load decoded a window of silence on a decoder of its own, so the step's
    # kernels and buffers exist and no warm-up runs (WindowDecoder.mark_path_warm). One step on the
    # device loop (its body holds that step's graph K times), K unrolled steps on the rung below;
    # every real step was a replay.
    captured = 1 if model.decoder.graph.rung(model.decoder.graph.captured_keys()[0]) == "device loop" else \
        model.decoder.steps_per_replay
    assert first == captured
    tokens_of(model, noise(8.0, 3), max_new_tokens=40)
    assert calls["n"] == first
    assert model.decoder.graph.captured_keys() == [GreedyKey(1)]
    assert model.decoder.state.addresses() == addresses


def in_a_fresh_process(code: str, *args: str, **env) -> subprocess.CompletedProcess:
    """``code`` run by a new Python (``args`` in its ``sys.argv[1:]``) with ostinato's source on its
    path; what it printed, once it exited cleanly."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]), **env)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_triton_is_prepared_while_the_model_loads(data_dir):
    """In a fresh process, loading a model on CUDA leaves Triton's installation hash, every loaded
    kernel's source key and argument binder made (helper threads did them during the load), what
    the binders' first call imports imported, and the device loop's gate compiled. The only kernels
    the load launches are its decode of a window of silence's (a previous text's head and two
    steps), for their first launch (without it, none): each of them a one-row greedy transcription
    with a prompt launches too (nothing compiled that a run does not use)."""
    code = (
        "import sys, json, numpy as np, torch, triton.runtime.cache as cache\n"
        "import ostinato.models.whisper.model as whisper_model\n"
        "from ostinato import WhisperModel\n"
        "from ostinato.ops.triton_support import SPECIALIZER_IMPORTS, loaded_kernels\n"
        "from ostinato.runtime import device_loop\n"
        "if sys.argv[1:] == ['without-silence']:\n"
        "    whisper_model._decode_silence = lambda *args: None\n"
        "assert cache.triton_key.cache_info().currsize == 0\n"
        "assert not set(SPECIALIZER_IMPORTS) & set(sys.modules) and not device_loop._gates\n"
        f"model = WhisperModel({str(data_dir / RANDOM_CKPT)!r}, device='cuda', compute_type='float16')\n"
        "assert set(SPECIALIZER_IMPORTS) <= set(sys.modules)\n"
        "assert device_loop.unavailable_reason('cuda') or list(device_loop._gates) == [0]\n"
        "kernels = list(loaded_kernels())\n"
        "launched = lambda: sorted(k._fn_name + ' ' + str(key) for k in loaded_kernels()\n"
        "                          for c in k.device_caches.values() for key in c[0])\n"
        "at_load = launched()\n"
        "counts = [cache.triton_key.cache_info().currsize, len(kernels), sum(k.hash is not None for k in kernels),\n"
        "          sum(len(k.device_caches) == 1 for k in kernels)]\n"
        "audio = (0.1 * np.random.default_rng(0).standard_normal(16000 * 8)).astype(np.float32)\n"
        "segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, max_new_tokens=20,\n"
        "                               initial_prompt=' '.join(['words'] * 12))  # a head over 8 tokens\n"
        "assert list(segments) is not None  # the segments are decoded as they are read\n"
        "print(json.dumps([counts, at_load, launched()]))\n"
    )
    # without the kernel manifest: an earlier process's kernels would be loaded back by the load
    runs = [json.loads(in_a_fresh_process(code, mode, OSTINATO_NO_KERNEL_MANIFEST="1").stdout.strip().splitlines()[-1])
            for mode in ("as-is", "without-silence")]
    for (keyed, kernels, hashed, bound), _, _ in runs:
        assert keyed == 1 and kernels >= 5 and hashed == kernels == bound, runs
    (_, at_load, _), (_, none_at_load, transcription_launched) = runs
    assert none_at_load == [] and at_load, runs
    assert set(at_load) <= set(transcription_launched), sorted(set(at_load) - set(transcription_launched))


def test_a_second_process_brings_back_the_kernels_the_first_launched(random_tiny_checkpoint):
    """ops.kernel_manifest across processes: the first records the Triton specializations its
    transcription launched; the next load of the same model loads them from Triton's cache before
    anything launches, and the same transcription then needs no other, with the same tokens. (The
    load's own decode of a window of silence is left out here: it launches the same kernels.)"""
    code = (
        "import json, logging, sys, numpy as np, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "logging.getLogger('ostinato.ops.kernel_manifest').setLevel(logging.DEBUG)\n"
        "from ostinato import WhisperModel\n"
        "from ostinato.models.whisper.loaders import load_checkpoint\n"
        "from ostinato.ops import kernel_manifest, triton_support\n"
        "import ostinato.models.whisper.model as whisper_model\n"
        "whisper_model._decode_silence = lambda *args: None\n"
        f"checkpoint = {str(random_tiny_checkpoint)!r}\n"
        "name = kernel_manifest.manifest_name('whisper', load_checkpoint(checkpoint).dims.to_dict(), torch.float16)\n"
        "if sys.argv[1:] == ['fresh']:\n"
        "    kernel_manifest.manifest_path(name).unlink(missing_ok=True)  # only a cache: start without it\n"
        "model = WhisperModel(checkpoint, device='cuda', compute_type='float16')\n"
        "loaded = lambda: sorted(k._fn_name + ' ' + key for k in triton_support.loaded_kernels()\n"
        "                        for c in k.device_caches.values() for key in c[0])\n"
        "after_load = loaded()\n"
        "audio = (0.1 * np.random.default_rng(0).standard_normal(16000 * 8)).astype(np.float32)\n"
        "segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, max_new_tokens=20)\n"
        "print(json.dumps([after_load, loaded(), [t for s in segments for t in s.tokens],\n"
        "                  str(kernel_manifest.manifest_path(name))]))\n"
    )
    runs = [(json.loads(out.stdout.strip().splitlines()[-1]), out.stderr[-2000:])
            for out in (in_a_fresh_process(code, "fresh"), in_a_fresh_process(code, "again"))]
    ((first_load, first_after, first_tokens, path), _), ((second_load, second_after, second_tokens, _), log) = runs
    assert len(first_after) > len(first_load) and Path(path).is_file()
    # all back at the load, nothing new at the launch
    assert set(first_after) <= set(second_load), (sorted(set(first_after) - set(second_load)), log)
    assert second_after == second_load, (sorted(set(second_after) - set(second_load)), log)
    assert second_tokens == first_tokens


def test_one_copy_of_weights_and_memory_report(data_dir):
    torch.cuda.reset_peak_memory_stats()
    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    tokens_of(model, noise(4.0), max_new_tokens=30)
    assert duplicated_parameters(model.model) == {}
    assert model.decoder.model is model.model
    emb = model.model.decoder.token_embedding.weight
    assert emb.is_cuda and emb.dtype == torch.float16
    report = model.memory_report()
    param_bytes = sum(p.numel() * p.element_size() for p in model.model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.model.buffers())
    # packing each decoder layer's self-attention q/k/v adds the key's zero bias, and nothing else
    packed_zeros = sum(b.attn.key.weight.shape[0] * 2 for b in model.model.decoder.blocks)
    assert report.parameter_bytes == param_bytes + buffer_bytes + packed_zeros
    assert report.state_bytes == model.decoder.state.nbytes() > 0
    assert report.peak_bytes is not None and report.peak_bytes >= report.parameter_bytes + report.state_bytes


@pytest.fixture(scope="module")
def tiny_models(tiny_en_path):
    cpu = WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")
    gpu = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float32", use_graphs=True)
    return cpu, gpu


@pytest.mark.parametrize("clip", CLIPS)
def test_tiny_en_cpu_eager_equals_gpu_graph_float32(tiny_models, data_dir, clip):
    cpu, gpu = tiny_models
    audio = clip_samples(data_dir, clip)
    want = tokens_of(cpu, audio)
    got = tokens_of(gpu, audio)
    assert got == want
    assert gpu.decoder.graph.mode(GreedyKey(1)) == "graph"
    # And both are faster-whisper's tokens where the reference has the clip.
    refs = json.loads((data_dir / "refs" / "faster_whisper_tiny_en.json").read_text())["runs"]["greedy"]
    if f"{clip}.flac" in refs:
        assert got == [s["tokens"] for s in refs[f"{clip}.flac"]["segments"]]


@pytest.mark.parametrize("clip", ["c02_numbers", "c08_story_long", "c13_nyc_white15"])
def test_tiny_en_gpu_graph_equals_gpu_eager_float16(tiny_en_path, data_dir, clip):
    audio = clip_samples(data_dir, clip)
    eager = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float16", use_graphs=False)
    graph = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float16", use_graphs=True)
    want = tokens_of(eager, audio)
    assert tokens_of(graph, audio) == want
    assert want and any(want)


@pytest.mark.parametrize("busy", [True, False], ids=["device-busy", "device-soon-done"])
@pytest.mark.parametrize("together", [1, 2])
def test_a_smaller_bucket_s_graph_is_captured_in_spare_time(data_dir, together, busy, monkeypatch):
    """A run of four rows, none in use, admits ``together`` windows: the smaller bucket's capture is
    deferred (one row: the load ran a one-row decode; two rows: captured without a warm-up, as a
    warm step's new shapes are) and the run's four-row graph steps the windows. If its clock says
    the advance keeps the device busy for longer than a capture takes, the run's spare time captures
    the smaller graph then, running nothing; if not, the capture waits for the bucket's next need
    (the next admission of that many windows into an idle run). The next windows admitted together
    replay their own rows either way; all get the eager decoder's tokens."""
    from ostinato.models.whisper.decoding import WindowDecoder
    from ostinato.models.whisper.search import SearchOptions, WindowJob, WindowRequest

    model = WhisperModel(str(data_dir / RANDOM_CKPT), device="cuda", compute_type="float16")
    tok = model.tokenizer
    n = 2 * together
    features = torch.cat([model.encode(model.features(noise(30.0, seed=110 + i))[None, :, :3000]) for i in range(n)])
    requests = [WindowRequest([tok.sot, tok.no_timestamps], False, 50, 60) for _ in range(n)]
    suppress = tok.suppressed_tokens([-1])
    with torch.inference_mode():
        eager = WindowDecoder(model.model, tok, model.device, use_graphs=False, buckets=(1,))
        want = [eager.decode(features[i : i + 1], [r], suppress, [])[0].tokens for i, r in enumerate(requests)]
        decoder = WindowDecoder(model.model, tok, model.device, buckets=(1, 2, 4))
        run = decoder.start(SearchOptions(), suppress, [], windows=4)
        graph, smaller = decoder.graph, GreedyKey(rows=together)
        monkeypatch.setattr(run.clock, "seconds_left", lambda: 10.0 if busy else 0.0)
        replayed = []
        original = type(graph).__call__

        def recording(self, key, **inputs):
            if self is graph:
                replayed[-1].append(key.rows)
            return original(self, key, **inputs)

        type(graph).__call__ = recording
        got = {}
        try:
            for first in range(0, n, together):
                replayed.append([])
                batch = range(first, first + together)
                slots = run.admit([WindowJob(features[i : i + 1], requests[i]) for i in batch])
                window_of = dict(zip(slots, batch))
                assert graph.is_captured(smaller) == (first > 0)
                run.advance()
                if first == 0:
                    while run.use_spare_time():  # the windows' prefill key, met once, is deferred too
                        pass
                    assert graph.is_captured(smaller) == busy  # captured behind the four-row advance, or not yet
                while len(got) < first + together:
                    results = run.collect()
                    got.update({window_of[slot]: result.tokens for slot, result in results.items()})
                    if len(got) < first + together:
                        run.advance()
        finally:
            type(graph).__call__ = original
    assert [got[i] for i in range(n)] == want
    # the run's graph first; once the smaller one is captured, what is left of the first windows may step in it
    assert replayed[0][0] == 4 and set(replayed[0]) <= {4, together} and set(replayed[1]) == {together}
    assert busy or set(replayed[0]) == {4}  # (its capture waited: the first windows stepped in the run's graph)
    assert sorted(k.rows for k in graph.captured_keys()) == [together, 4]
