"""Transducers against NeMo 3.0.0: tiny random-weight FastConformer RNN-T and TDT .nemo models.

tests/data/transducer/ is written by dev/make_transducer_models.py (run with NeMo installed): the
models, NeMo's greedy_batch (label-looping) tokens, frames and TDT durations for max_symbols 1, 2
and 10 over clips and synthetic signals, alone and in mixed batches, and NeMo's preprocessor
features and encoder output for one input. NeMo itself is not needed here.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato.models.transducer import TransducerModel

KINDS = ("rnnt", "tdt")


@pytest.fixture(scope="module")
def tdata(data_dir) -> Path:
    return data_dir / "transducer"


@pytest.fixture(scope="module")
def refs(tdata):
    return json.loads((tdata / "refs.json").read_text())


@pytest.fixture(scope="module")
def stages(tdata):
    return dict(np.load(tdata / "stages.npz"))


@pytest.fixture(scope="module")
def models(tdata):
    return {kind: TransducerModel(tdata / f"tiny_{kind}.nemo", device="cpu") for kind in KINDS}


@pytest.fixture(scope="module")
def inputs(data_dir, refs, stages):
    """The reference inputs as load_audio gives them (clips decoded from FLAC, synthetic from the npz)."""
    out = {}
    for name, meta in refs["inputs"].items():
        if meta["source"] == "clip":
            pytest.importorskip("av")
            from ostinato.audio import load_audio

            samples = load_audio(str(data_dir / "clips" / f"{name}.flac"))
        else:
            samples = stages[f"input_{name}"].astype(np.float32) / 32768.0
        pcm = np.round(samples.astype(np.float64) * 32768.0).astype(np.int64)
        assert pcm.size == meta["samples"] and int(pcm.sum()) == meta["checksum"], name
        out[name] = samples
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_features_match_nemo(models, stages, inputs, kind):
    model = models[kind]
    feats, lengths = model.features([inputs["c01_hello_short"]])
    want = stages[f"{kind}_features"]
    assert int(lengths[0]) == int(stages[f"{kind}_features_length"])
    assert feats.shape[1:] == want.shape
    np.testing.assert_allclose(feats[0].numpy(), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_encoder_matches_nemo(models, stages, kind):
    model = models[kind]
    feats = torch.from_numpy(stages[f"{kind}_features"])[None]
    length = torch.tensor([int(stages[f"{kind}_features_length"])])
    enc, enc_len = model.encode(feats, length)
    want = stages[f"{kind}_encoder"]  # NeMo's layout: [d_model, T]
    assert int(enc_len[0]) == int(stages[f"{kind}_encoder_length"])
    np.testing.assert_allclose(enc[0].numpy().T, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_decodes_identical_to_nemo(models, refs, inputs, kind):
    """Every recorded NeMo decode: tokens, frames, text and (TDT) durations, alone and batched."""
    model = models[kind]
    decodes = refs["models"][kind]["decodes"]
    assert {d["max_symbols"] for d in decodes} == {1, 2, 10}
    assert any(len(d["batch"]) > 1 for d in decodes)
    checked = 0
    for dec in decodes:
        results = model.transcribe_batch([inputs[n] for n in dec["batch"]], batch_size=8,
                                         max_symbols=dec["max_symbols"])
        for name, got, want in zip(dec["batch"], results, dec["results"]):
            where = f"{kind} max_symbols={dec['max_symbols']} batch={dec['batch']} input={name}"
            assert got.tokens == want["tokens"], where
            assert got.frames == want["frames"], where
            assert got.text == want["text"], where
            if kind == "tdt":
                assert got.durations == want["durations"], where
            else:
                assert got.durations is None
            checked += 1
    assert checked >= 40


def test_references_are_not_trivial(refs):
    """The tuned biases make blanks and labels both occur, and max_symbols change the output."""
    for kind in KINDS:
        by_ms = {}
        for dec in refs["models"][kind]["decodes"]:
            if len(dec["batch"]) == 1:
                by_ms.setdefault(dec["max_symbols"], []).append(dec["results"][0])
        counts = {ms: sum(len(r["tokens"]) for r in rs) for ms, rs in by_ms.items()}
        frames = sum(r["encoded_length"] for r in by_ms[10])
        assert 0 < counts[1] < counts[2] < counts[10] < 10 * frames, (kind, counts)
    durations = [d for dec in refs["models"]["tdt"]["decodes"] for r in dec["results"] for d in r.get("durations", [])]
    assert {0, 1, 2} <= set(durations)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_single(models, inputs, kind):
    model = models[kind]
    names = ["c02_numbers", "syn_tiny", "c06_pink10_scotland", "syn_chirp", "c01_hello_short"]
    batched = model.transcribe_batch([inputs[n] for n in names], batch_size=5, max_symbols=3)
    for name, got in zip(names, batched):
        alone = model.transcribe(inputs[name], max_symbols=3)
        assert (got.tokens, got.frames, got.durations) == (alone.tokens, alone.frames, alone.durations), name


@pytest.mark.parametrize("kind", KINDS)
def test_rows_are_refilled_as_utterances_end(models, inputs, kind, monkeypatch):
    """Five utterances through two rows: an utterance that ends hands its row to the next at once,
    and every result is the one the utterance gets alone."""
    from ostinato.models.transducer import label_looping

    model = models[kind]
    names = ["c02_numbers", "syn_tiny", "c06_pink10_scotland", "syn_chirp", "c01_hello_short"]
    admissions = []
    admit = label_looping.TransducerRun.admit

    def recording(run, utterances):
        admissions.append((run.busy, len(utterances)))
        return admit(run, utterances)

    monkeypatch.setattr(label_looping.TransducerRun, "admit", recording)
    batched = model.transcribe_batch([inputs[n] for n in names], batch_size=2, max_symbols=3)
    monkeypatch.undo()
    assert any(busy for busy, _ in admissions), "no utterance was admitted while another was decoding"
    assert sum(n for _, n in admissions) == len(names)
    for name, got in zip(names, batched):
        alone = model.transcribe(inputs[name], max_symbols=3)
        assert (got.tokens, got.frames, got.durations) == (alone.tokens, alone.frames, alone.durations), name


def test_result_fields(models, inputs):
    model = models["tdt"]
    r = model.transcribe(inputs["c03_questions_f3"], max_symbols=10)
    assert len(r.tokens) == len(r.frames) == len(r.durations) == len(r.timestamps)
    assert r.frames == sorted(r.frames)
    assert r.timestamps == [round(f * 0.08, 3) for f in r.frames]
    assert abs(r.audio_duration - inputs["c03_questions_f3"].size / 16000) < 1e-9
    assert r.text == model.tokenizer.decode(r.tokens)
