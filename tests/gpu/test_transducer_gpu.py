"""Transducers on CUDA: CPU eager, GPU eager and GPU graph paths give identical tokens, frames and
durations on the tiny NeMo models (and, in float32, NeMo's own references).

The device machine has no PyAV: clips come from OSTINATO_CLIP_SAMPLES (a folder of int16 .npy, see
dev/export_device_bundle.py) when set; the synthetic inputs always come from stages.npz.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato.models.transducer import TransducerModel
from ostinato.models.transducer.label_looping import TransducerKey
from ostinato.testing.random_models import fake_tokenizer, parakeet_tdt_v2_config, pattern, random_transducer_network
from ostinato.testing.transducer_oracle import check_ties, compare_with_plain, plain_greedy_decode, record_decisions

pytestmark = pytest.mark.gpu
KINDS = ("rnnt", "tdt")


def reference_inputs(data_dir: Path):
    tdata = data_dir / "transducer"
    refs = json.loads((tdata / "refs.json").read_text())
    stages = np.load(tdata / "stages.npz")
    folder = os.environ.get("OSTINATO_CLIP_SAMPLES")
    have_av = True
    try:
        import av  # noqa: F401
    except ImportError:
        have_av = False
    inputs = {}
    for name, meta in refs["inputs"].items():
        if meta["source"] != "clip":
            inputs[name] = stages[f"input_{name}"].astype(np.float32) / 32768.0
        elif folder and (Path(folder) / f"{name}.npy").exists():
            inputs[name] = np.load(Path(folder) / f"{name}.npy").astype(np.float32) / 32768.0
        elif have_av:
            from ostinato.audio import load_audio

            inputs[name] = load_audio(str(data_dir / "clips" / f"{name}.flac"))
    return refs, inputs


def outputs(results):
    return [(r.tokens, r.frames, r.durations) for r in results]


def decodes(refs, inputs, kind):
    for dec in refs["models"][kind]["decodes"]:
        if all(n in inputs for n in dec["batch"]):
            yield dec


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_gpu_eager_gpu_graph_identical_float32(data_dir, kind):
    refs, inputs = reference_inputs(data_dir)
    path = data_dir / "transducer" / f"tiny_{kind}.nemo"
    cpu = TransducerModel(path, device="cpu")
    eager = TransducerModel(path, device="cuda", compute_type="float32", use_graphs=False)
    graph = TransducerModel(path, device="cuda", compute_type="float32", use_graphs=True)
    checked = 0
    for dec in decodes(refs, inputs, kind):
        audios = [inputs[n] for n in dec["batch"]]
        ms = dec["max_symbols"]
        want = outputs(cpu.transcribe_batch(audios, batch_size=8, max_symbols=ms))
        assert outputs(eager.transcribe_batch(audios, batch_size=8, max_symbols=ms)) == want, dec["batch"]
        assert outputs(graph.transcribe_batch(audios, batch_size=8, max_symbols=ms)) == want, dec["batch"]
        for (tokens, frames, durations), ref in zip(want, dec["results"]):
            assert tokens == ref["tokens"] and frames == ref["frames"]
            if kind == "tdt":
                assert durations == ref["durations"]
        checked += 1
    assert checked >= 9
    assert graph.decoder.graph.mode(TransducerKey(1)) == "graph"
    assert eager.decoder.graph.mode(TransducerKey(1)) == "eager"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_graph_equals_gpu_eager_half(data_dir, kind, dtype):
    refs, inputs = reference_inputs(data_dir)
    path = data_dir / "transducer" / f"tiny_{kind}.nemo"
    eager = TransducerModel(path, device="cuda", compute_type=dtype, use_graphs=False)
    graph = TransducerModel(path, device="cuda", compute_type=dtype, use_graphs=True)
    for dec in decodes(refs, inputs, kind):
        audios = [inputs[n] for n in dec["batch"]]
        ms = dec["max_symbols"]
        assert outputs(graph.transcribe_batch(audios, batch_size=8, max_symbols=ms)) == outputs(
            eager.transcribe_batch(audios, batch_size=8, max_symbols=ms)
        )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_device_loop_with_refills_equals_kstep_and_eager(data_dir, dtype):
    """Eleven utterances through four rows (batch_size 3 rounds up to the bucket of 4): rows are refilled as utterances end, on the device loop
    (which stops at the first ended row while others wait, and runs to the end when none do), on
    the K-step rung and eagerly, with the same tokens; float32 also equals the CPU."""
    from ostinato.runtime import device_loop

    refs, inputs = reference_inputs(data_dir)
    path = data_dir / "transducer" / "tiny_tdt.nemo"
    audios = [inputs[n] for n in sorted(inputs)][:11]
    models = {loop: TransducerModel(path, device="cuda", compute_type=dtype, decode_loop=loop)
              for loop in ("auto", "kstep", "eager")}
    got = {loop: outputs(m.transcribe_batch(audios, batch_size=3, max_symbols=4)) for loop, m in models.items()}
    assert got["auto"] == got["kstep"] == got["eager"]
    if dtype == "float32":
        cpu = TransducerModel(path, device="cpu")
        assert got["auto"] == outputs(cpu.transcribe_batch(audios, batch_size=3, max_symbols=4))
    looping = device_loop.unavailable_reason("cuda") is None
    rung = models["auto"].decoder.graph.rung(TransducerKey(4))
    assert rung == ("device loop" if looping else "one step per replay")
    assert models["kstep"].decoder.graph.rung(TransducerKey(4)) == "one step per replay"
    assert models["eager"].decoder.graph.rung(TransducerKey(4)) == "eager"


def test_graphs_captured_once_per_bucket_and_state_stays_put(data_dir):
    path = data_dir / "transducer" / "tiny_tdt.nemo"
    model = TransducerModel(path, device="cuda", compute_type="float16")
    rng = np.random.default_rng(0)
    audio = [(0.1 * rng.standard_normal(16000 * s)).astype(np.float32) for s in (3, 5, 4, 2, 6)]
    model.transcribe_batch(audio, batch_size=5)  # allocates the state for 8 rows, captures bucket 8
    model.transcribe(audio[0])  # captures bucket 1 on the same state
    addresses = model.decoder.state.addresses()
    calls = {"n": 0}
    step = model.decoder.graph.step

    def counting(*args, **kwargs):
        calls["n"] += 1
        return step(*args, **kwargs)

    model.decoder.graph.step = counting
    model.transcribe(audio[1])
    model.transcribe(audio[2])
    model.transcribe_batch(audio[::-1], batch_size=5)
    model.transcribe_batch(audio[:3], batch_size=3)  # bucket 4: one warm-up run and the capture
    assert calls["n"] == 2
    model.transcribe_batch(audio[1:4], batch_size=3)
    assert calls["n"] == 2  # every other call replayed a captured graph
    assert sorted(model.decoder.graph.captured_keys()) == [TransducerKey(1), TransducerKey(4), TransducerKey(8)]
    assert model.decoder.state.addresses() == addresses


def test_one_copy_of_weights_and_memory_report(data_dir):
    from ostinato.runtime import duplicated_parameters

    model = TransducerModel(data_dir / "transducer" / "tiny_rnnt.nemo", device="cuda")
    model.transcribe(np.zeros(16000 * 2, dtype=np.float32))
    assert not duplicated_parameters(model.network)
    assert model.decoder.prednet is model.network.prednet and model.decoder.joint is model.network.joint
    report = model.memory_report()
    assert report.peak_bytes is not None and report.peak_bytes > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_half_encoder_close_to_float32(data_dir, kind, dtype):
    """The half-precision encoder (fused Triton kernels where available) against the float32 one,
    on a padded batch of three lengths (length groups and key padding both exercised)."""
    import torch

    path = data_dir / "transducer" / f"tiny_{kind}.nemo"
    ref = TransducerModel(path, device="cuda", compute_type="float32")
    half = TransducerModel(path, device="cuda", compute_type=dtype)
    rng = np.random.default_rng(0)
    audio = [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in (3.3, 7.1, 5.0)]
    feats, lengths = ref.features(audio)
    want, want_len = ref.encode(feats, lengths)
    got, got_len = half.encode(feats, lengths)
    assert torch.equal(got_len, want_len)
    for i, n in enumerate(want_len.tolist()):
        a, b = got[i, :n].float(), want[i, :n]
        assert torch.isfinite(a).all()
        assert ((a - b).norm() / b.norm()).item() < (1e-2 if dtype == "float16" else 3e-2), (i, dtype)


def test_graph_decode_differs_from_the_plain_loop_only_at_rounding_ties():
    """Parakeet-TDT-0.6B's decoder shape, random weights, 32 utterances of 30-60 s: the graphs'
    decisions replayed in float64 are each the exact best or a tie within float16 rounding, and
    where the one-row-at-a-time plain PyTorch loop decides differently, that too is such a tie.

    On the H100 (torch 2.11) utterance 28 parts at its 35th decision: labels 786 and 506 lie 0.66
    ulp apart in exact arithmetic; the graphs take the exact best, the plain loop's rounding puts
    the other on top."""
    cfg = parakeet_tdt_v2_config()
    cfg.encoder.n_layers = 1  # the encoder is not run: its output is given
    net = random_transducer_network(cfg, "cuda", torch.float16)
    tok = fake_tokenizer(cfg.vocab_size)
    graph = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16")
    stepper = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16", use_graphs=False,
                                           steps_per_replay=1).decoder
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, frames = 32, 750
    enc = torch.randn(batch, frames, cfg.encoder.d_model, device="cuda", generator=gen)
    enc[:, :, :7] = pattern(frames, 1).cuda()[None]
    enc = enc.half()
    lengths = torch.randint(375, frames + 1, (batch,), generator=gen, device="cuda").tolist()
    hyps = graph.decoder.decode(enc, torch.tensor(lengths), 10)
    log = record_decisions(stepper, enc, lengths, 10)
    for r, hyp in enumerate(hyps):  # the step-by-step log is the graphs' arithmetic
        emitted = log.active[:, r] & (log.label[:, r] != cfg.blank_id)
        assert log.label[emitted, r].tolist() == hyp.tokens and log.t[emitted, r].tolist() == hyp.frames
    plain, plain_logs = plain_greedy_decode(net, cfg, enc, lengths, 10)
    same, divergences, replay = compare_with_plain(net, cfg, enc, lengths, log, plain_logs)
    tol = replay.tolerance()
    print(f"\n{len(same)}/{batch} identical; largest rounding error {replay.largest_rounding_error:.2f} ulp; "
          f"worst margin {replay.worst_margin():.2f} ulp; tolerance {tol:.2f} ulp")
    for d in divergences:
        print(d.describe(tol))
    assert check_ties(divergences, replay) is None
    assert len(same) + len(divergences) == batch
    assert sum(len(h.tokens) for h in hyps) > 2000
    # float16 logits near 50 are 1/32 apart: the run has near-ties, so the rule was put to work
    assert (replay.label_margin[np.isfinite(replay.label_margin)] > 0).sum() > 10


def test_uploads_ahead_of_the_encoder_equal_one_batch(data_dir):
    """The pipeline that fills and copies the next length group's samples (worker thread, side stream)
    while the device encodes the previous one: each upload holds its samples, and every row's encoder
    output and transcript equal those of features-then-encode on the whole batch in one call."""
    from ostinato.runtime import upload_batches

    rng = np.random.default_rng(3)
    arrays = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (5_000, 91_000, 17, 40_000)]
    got = list(upload_batches([arrays[:2], arrays[2:], arrays[1:3]], torch.device("cuda")))
    for batch, rows in zip(got, (arrays[:2], arrays[2:], arrays[1:3])):
        assert batch.is_cuda and batch.shape == (len(rows), max(a.shape[0] for a in rows))
        for i, a in enumerate(rows):
            assert torch.equal(batch[i, : a.shape[0]].cpu(), torch.from_numpy(a))
            assert not batch[i, a.shape[0]:].any()
    # with a first step on the side stream, its outputs read on the caller's stream (big enough
    # batches that a missing wait would read unfinished sums)
    big = [[rng.standard_normal(2_000_000).astype(np.float32) for _ in range(4)] for _ in range(5)]
    sums = list(upload_batches(big, torch.device("cuda"), prepare=lambda batch, arrays: (batch * 2).sum(1)))
    for s, arrays in zip(sums, big):
        torch.testing.assert_close(s.cpu(), torch.tensor([2 * a.astype(np.float64).sum() for a in arrays]).float(),
                                   rtol=1e-4, atol=1e-2)

    model = TransducerModel(data_dir / "transducer" / "tiny_tdt.nemo", device="cuda", compute_type="float16")
    model.group_overhead_frames = 0  # several length groups
    model.feature_call_samples = 150_000  # and some groups in several preprocessor calls
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in
              (52_000, 9_000, 31_000, 9_500, 70_000, 66_000, 12_345, 48_000)]
    enc, enc_len = model._encode_samples(audios)
    ref, ref_len = model.encode(*model.features(audios))
    assert torch.equal(enc_len, ref_len)
    for i in range(len(audios)):
        n = int(ref_len[i])
        torch.testing.assert_close(enc[i, :n].float(), ref[i, :n].float(), rtol=0, atol=2e-2)
    together = model.transcribe_batch(audios, batch_size=len(audios), max_symbols=10)
    hyps = model.decoder.decode(ref, ref_len, 10)
    assert outputs(together) == [(h.tokens, h.frames, h.durations) for h in hyps]
