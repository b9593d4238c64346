"""Transducer checkpoints: clear typed errors for broken or unsupported .nemo files; tokenizer;
chunked long-audio encoding; segments and writers; option checks."""
import io
import tarfile

import numpy as np
import pytest
import torch
import yaml

from ostinato.errors import AudioError, InvalidOptionError, ModelLoadError, UnsupportedCheckpointError
from ostinato.models.transducer import TransducerModel
from ostinato.models.transducer.nemo_checkpoint import load_nemo
from ostinato.models.transducer.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, SentencePieceDecoder


@pytest.fixture(scope="module")
def tiny(data_dir):
    return data_dir / "transducer" / "tiny_tdt.nemo"


@pytest.fixture(scope="module")
def model(tiny):
    return TransducerModel(tiny, device="cpu")


def members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_nemo(path, files):
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def edited(tmp_path, tiny, edit=None, drop=None):
    files = members(tiny)
    key = next(k for k in files if k.endswith("model_config.yaml"))
    cfg = yaml.safe_load(files[key])
    if edit:
        edit(cfg)
    files[key] = yaml.safe_dump(cfg).encode()
    if drop:
        files = {k: v for k, v in files.items() if not k.endswith(drop)}
    return write_nemo(tmp_path / "edited.nemo", files)


def test_missing_and_corrupt_files(tmp_path, tiny):
    with pytest.raises(ModelLoadError, match="not found"):
        load_nemo(tmp_path / "nope.nemo")
    junk = tmp_path / "junk.nemo"
    junk.write_bytes(b"\x00not a tar archive" * 100)
    with pytest.raises(ModelLoadError, match="not a readable .nemo archive"):
        load_nemo(junk)
    truncated = tmp_path / "truncated.nemo"
    truncated.write_bytes(tiny.read_bytes()[:3000])
    with pytest.raises(ModelLoadError):
        load_nemo(truncated)
    with pytest.raises(ModelLoadError, match="directory"):
        load_nemo(tmp_path)


@pytest.mark.parametrize("missing", ["model_config.yaml", "model_weights.ckpt", "tokenizer.model"])
def test_missing_member_is_named(tmp_path, tiny, missing):
    path = edited(tmp_path, tiny, drop=missing)
    with pytest.raises(ModelLoadError, match=missing.replace(".", r"\.")):
        load_nemo(path)


def test_corrupt_members(tmp_path, tiny):
    files = members(tiny)
    weights = next(k for k in files if k.endswith("model_weights.ckpt"))
    broken = dict(files)
    broken[weights] = b"garbage"
    with pytest.raises(ModelLoadError, match="model_weights.ckpt"):
        load_nemo(write_nemo(tmp_path / "w.nemo", broken))
    config = next(k for k in files if k.endswith("model_config.yaml"))
    broken = dict(files)
    broken[config] = b"encoder: [unclosed"
    with pytest.raises(ModelLoadError, match="not valid YAML"):
        load_nemo(write_nemo(tmp_path / "c.nemo", broken))
    tok = next(k for k in files if k.endswith("tokenizer.model"))
    broken = dict(files)
    broken[tok] = b"\xff\xff\xff"
    with pytest.raises(UnsupportedCheckpointError, match="SentencePiece"):
        load_nemo(write_nemo(tmp_path / "t.nemo", broken))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["encoder"].update(_target_="nemo.collections.asr.modules.SqueezeformerEncoder"), "encoder"),
        (lambda c: c["encoder"].update(self_attention_model="rel_pos_local_attn"), "self_attention_model"),
        (lambda c: c["encoder"].update(subsampling="vggnet"), "subsampling"),
        (lambda c: c["encoder"].update(att_context_size=[70, 13]), "context"),
        (lambda c: c["decoder"].update(_target_="nemo.collections.asr.modules.StatelessTransducerDecoder"), "prediction network"),
        (lambda c: c.pop("joint"), "joint"),
        (lambda c: c.update(target="nemo.collections.asr.models.EncDecCTCModelBPE"), "EncDecCTCModelBPE"),
        (lambda c: c["tokenizer"].update(type="wpe"), "tokenizer type 'wpe'"),
        (lambda c: c.pop("tokenizer"), "tokenizer"),
        (lambda c: c["joint"].update(num_extra_outputs=3), "durations"),
        (lambda c: c["decoder"].update(vocab_size=99), "tokenizer has"),
    ],
)
def test_unsupported_architecture_is_named(tmp_path, tiny, edit, message):
    with pytest.raises(UnsupportedCheckpointError, match=message):
        load_nemo(edited(tmp_path, tiny, edit))


def test_weights_not_matching_config(tmp_path, tiny):
    path = edited(tmp_path, tiny, lambda c: c["encoder"].update(n_layers=3))
    with pytest.raises(UnsupportedCheckpointError, match="encoder.layers.2"):
        TransducerModel(path, device="cpu")
    path = edited(tmp_path, tiny, lambda c: c["encoder"].update(d_model=64))
    with pytest.raises(UnsupportedCheckpointError):
        TransducerModel(path, device="cpu")


def test_gzip_archive_loads(tmp_path, tiny):
    files = members(tiny)
    path = tmp_path / "gz.nemo"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert load_nemo(path).config.is_tdt


def test_config_fields(tiny, data_dir):
    tdt = load_nemo(tiny).config
    assert tdt.durations == [0, 1, 2, 3, 4] and tdt.blank_id == tdt.vocab_size == 40
    assert tdt.encoder.subsampling_factor == 8 and tdt.frame_seconds == pytest.approx(0.08)
    rnnt = load_nemo(data_dir / "transducer" / "tiny_rnnt.nemo").config
    assert not rnnt.is_tdt and rnnt.pred_layers == 1


def test_sentencepiece_decoder_rules():
    pieces = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("\u2581he", NORMAL), ("llo", NORMAL), ("\u2581", NORMAL),
              ("<0xC3>", BYTE), ("<0xA9>", BYTE), ("\u2581w", NORMAL)]
    d = SentencePieceDecoder(pieces)
    assert d.decode([2, 3]) == "hello"
    assert d.decode([1, 2, 3, 7]) == "hello w"
    assert d.decode([4, 2]) == " he"  # only the first piece loses its space mark
    assert d.decode([0, 3]) == " \u2047 llo"
    assert d.decode([2, 5, 6]) == "he\u00e9"
    assert d.decode([]) == ""
    with pytest.raises(ValueError):
        d.decode([99])


def test_max_symbols_and_batch_size_checked(model):
    audio = np.zeros(16000, dtype=np.float32)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidOptionError):
            model.transcribe(audio, max_symbols=bad)
    with pytest.raises(InvalidOptionError):
        model.transcribe_batch([audio], batch_size=0)


def test_steps_per_replay_does_not_change_results(tiny):
    audio = np.random.default_rng(5).standard_normal(16000 * 3).astype(np.float32) * 0.1
    one = TransducerModel(tiny, device="cpu", steps_per_replay=1).transcribe(audio, max_symbols=2)
    many = TransducerModel(tiny, device="cpu", steps_per_replay=13).transcribe(audio, max_symbols=2)
    assert (one.tokens, one.frames, one.durations) == (many.tokens, many.frames, many.durations)


def test_chunked_encoding_stitches_exactly(tiny):
    """With context covering the whole input, chunked encoding equals full-context encoding."""
    full = TransducerModel(tiny, device="cpu")
    chunked = TransducerModel(tiny, device="cpu", max_full_context_seconds=1.0, chunk_seconds=1.2,
                              chunk_context_seconds=20.0, chunk_batch=3)
    audio = np.random.default_rng(1).standard_normal(int(16000 * 5.3)).astype(np.float32) * 0.1
    feats, lengths = full.features([audio])
    a, la = full.encode(feats, lengths)
    b, lb = chunked.encode(feats, lengths)
    assert int(la[0]) == int(lb[0]) == a.shape[1] == b.shape[1]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_long_audio_decodes_across_chunk_boundaries(tiny):
    """Short windows with little context: the decode still runs over the whole stitched sequence."""
    model = TransducerModel(tiny, device="cpu", max_full_context_seconds=2.0, chunk_seconds=2.0,
                            chunk_context_seconds=0.5, chunk_batch=2)
    rng = np.random.default_rng(2)
    audio = (0.1 * rng.standard_normal(16000 * 12)).astype(np.float32)
    r = model.transcribe(audio, max_symbols=10)
    feats, lengths = model.features([audio])
    _, enc_len = model.encode(feats, lengths)
    assert int(enc_len[0]) == -(-(16000 * 12 // 160) // 8)
    assert r.tokens and r.frames[-1] >= int(enc_len[0]) - 25  # labels right up to the end
    boundaries = [k * 25 for k in range(1, 6)]  # 2-s windows = 25 encoder frames
    assert any(abs(f - b) <= 2 for f in r.frames for b in boundaries)


def test_many_long_inputs_together_equal_each_alone(tiny):
    """Long inputs (past the full-context limit) share window batches with each other, short ones in
    the same call are encoded whole: every result is the one the input gets alone."""
    model = TransducerModel(tiny, device="cpu", max_full_context_seconds=2.0, chunk_seconds=2.0,
                            chunk_context_seconds=0.5, chunk_batch=5)
    rng = np.random.default_rng(4)
    audios = [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in (9.3, 1.7, 12.0, 6.1, 2.4)]
    feats, lengths = model.features(audios)
    enc, enc_len = model.encode(feats, lengths)
    for i, audio in enumerate(audios):
        f1, l1 = model.features([audio])
        assert int(l1[0]) == int(lengths[i])
        torch.testing.assert_close(feats[i, :, : int(l1[0])], f1[0, :, : int(l1[0])], rtol=0, atol=1e-5)
        e1, n1 = model.encode(f1, l1)
        assert int(n1[0]) == int(enc_len[i])
        torch.testing.assert_close(enc[i, : int(n1[0])], e1[0, : int(n1[0])], rtol=0, atol=1e-5)
    together = model.transcribe_batch(audios, batch_size=3, max_symbols=10)
    alone = [model.transcribe(a, max_symbols=10) for a in audios]
    assert [(r.tokens, r.frames, r.durations) for r in together] == [(r.tokens, r.frames, r.durations) for r in alone]
    assert all(r.tokens for r in together)


def test_features_in_several_calls_equal_one_call(tiny):
    """Inputs too long for one preprocessor call are turned into features a few rows at a time."""
    model = TransducerModel(tiny, device="cpu")
    rng = np.random.default_rng(6)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (40_000, 23_456, 51_000, 8_000)]
    one, one_len = model.features(audios)
    model.feature_call_samples = 60_000  # at most one of these per call
    many, many_len = model.features(audios)
    assert torch.equal(one_len, many_len)
    assert one.shape == many.shape
    torch.testing.assert_close(many, one, rtol=0, atol=1e-5)


def test_length_groups_uploaded_one_by_one_equal_one_batch(tiny):
    """The pipeline that uploads and encodes one length group at a time gives every row the encoder
    output of features-then-encode on the whole batch, and the transcript each input gets alone."""
    model = TransducerModel(tiny, device="cpu")
    model.group_overhead_frames = 0  # a group per distinct length: several groups from five inputs
    rng = np.random.default_rng(8)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (52_000, 9_000, 31_000, 9_500, 70_000)]
    frames = [n // 160 for n in (52_000, 9_000, 31_000, 9_500, 70_000)]
    assert len(model._length_groups(frames)) >= 3
    enc, enc_len = model._encode_samples(audios)
    ref, ref_len = model.encode(*model.features(audios))
    assert torch.equal(enc_len, ref_len)
    for i in range(len(audios)):
        n = int(ref_len[i])
        torch.testing.assert_close(enc[i, :n], ref[i, :n], rtol=0, atol=1e-5)
    model.feature_call_samples = 60_000  # and each group's features in calls of one or two rows
    split, split_len = model._encode_samples(audios)
    assert torch.equal(split_len, ref_len)
    for i in range(len(audios)):
        n = int(ref_len[i])
        torch.testing.assert_close(split[i, :n], ref[i, :n], rtol=0, atol=1e-5)
    together = model.transcribe_batch(audios, batch_size=5, max_symbols=10)
    alone = [model.transcribe(a, max_symbols=10) for a in audios]
    assert [(r.tokens, r.frames, r.durations) for r in together] == [(r.tokens, r.frames, r.durations) for r in alone]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_name_the_input(model, bad):
    rng = np.random.default_rng(9)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (16_000, 24_000, 8_000)]
    audios[1][5_000] = bad
    with pytest.raises(AudioError, match="audio input 1 contains NaN or infinite samples"):
        model.transcribe_batch(audios, batch_size=3)
    with pytest.raises(AudioError, match="audio input 0 contains NaN"):
        model.features(audios[1:])
    assert model.transcribe_batch([audios[0], audios[2]], batch_size=2)[0].audio_duration == 1.0


def test_segments_and_writers(model, tmp_path):
    from ostinato.writers import write_result

    audio = np.random.default_rng(3).standard_normal(16000 * 4).astype(np.float32) * 0.1
    segments, info = model.transcribe_segments(audio)
    segments = list(segments)
    result = model.transcribe(audio)
    assert [t for s in segments for t in s.tokens] == result.tokens
    assert all(s.start <= s.end for s in segments)
    assert all(a.end <= b.start + 1e-9 or a.start <= b.start for a, b in zip(segments, segments[1:]))
    assert info.duration == pytest.approx(4.0)
    written = write_result(segments, info, "all", tmp_path / "out")
    assert {p.suffix for p in written} == {".txt", ".vtt", ".srt", ".tsv", ".json"}


def test_memory_report_and_single_copy(model):
    from ostinato.runtime import duplicated_parameters

    report = model.memory_report()
    assert report.parameter_bytes > 0
    assert not duplicated_parameters(model.network)


def test_cli_dispatches_nemo_models_to_the_transducer(tmp_path, tiny, data_dir, capsys):
    pytest.importorskip("av")
    from ostinato.cli import main

    clip = str(data_dir / "clips" / "c03_questions_f3.flac")
    code = main(["transcribe", clip, "--model", str(tiny), "--device", "cpu", "-o", str(tmp_path), "-f", "srt"])
    assert code == 0
    out = capsys.readouterr().out
    assert "-->" in out
    assert (tmp_path / "c03_questions_f3.srt").read_text().startswith("1\n00:00:")
    bad = tmp_path / "bad.nemo"
    bad.write_bytes(b"junk")
    assert main(["transcribe", clip, "--model", str(bad), "--device", "cpu", "-o", str(tmp_path)]) == 1
    assert "holds no checkpoint ostinato knows" in capsys.readouterr().err  # the name promises nothing
    renamed = tmp_path / "weights.bin"  # the family comes from the contents, not the name
    renamed.write_bytes(tiny.read_bytes() if hasattr(tiny, "read_bytes") else open(tiny, "rb").read())
    assert main(["transcribe", clip, "--model", str(renamed), "--device", "cpu", "-o", str(tmp_path), "-f", "txt"]) == 0
    assert (tmp_path / "c03_questions_f3.txt").read_text().strip()
