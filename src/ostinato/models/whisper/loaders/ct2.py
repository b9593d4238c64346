"""CTranslate2 Whisper directories (model.bin + config.json + vocabulary), parsed without ctranslate2.

model.bin layout (little endian), as written by ctranslate2/specs/model_spec.py:

    u32 binary_version                      (we read 1..6)
    if version >= 2: str spec_name, u32 spec_revision
    u32 n_variables, then per variable:
        str name, u8 rank, u32[rank] shape,
        version >= 4: u8 dtype_id, u32 n_bytes    (dtype ids: f32, i8, i16, i32, f16, bf16)
        version <  4: u8 item_size, u32 n_items   (dtype guessed from the width)
        n_bytes of row-major data
    if version >= 3: u32 n_aliases, then (str alias, str target) pairs
    str = u16 length including a trailing NUL, then the bytes.

The converter stores duplicated tensors once and aliases the others (for Whisper: the
output projection points at the token embedding). Quantized weights keep a per-row
float scale in "<name>_scale" with q = round(w * scale), so w = q / scale.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import BinaryIO, Dict, Optional, Tuple

import torch

from ostinato.errors import ModelLoadError, UnsupportedCheckpointError
from ostinato.models.whisper.config import WhisperDims
from ostinato.models.whisper.loaders.checkpoint import (
    WhisperCheckpoint,
    check_state_dict,
    guess_heads,
    normalize_alignment_heads,
)

_MAX_BINARY_VERSION = 6
_MAX_WHISPER_REVISION = 3
# Index = dtype id in model.bin (ctranslate2's DataType enum).
_DTYPES = (torch.float32, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16)
_LEGACY_DTYPES = {4: torch.float32, 2: torch.int16, 1: torch.int8}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f: BinaryIO, size: int):
        self.f = f
        self.size = size

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise _Truncated()
        return data

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        raw = self.take(self.u16())
        return raw.split(b"\0", 1)[0].decode("utf-8")

    def tensor(self, shape: Tuple[int, ...], dtype: torch.dtype, n_bytes: int) -> torch.Tensor:
        # A corrupt length must not make us allocate gigabytes before noticing.
        if n_bytes > self.size - self.f.tell():
            raise _Truncated()
        # Read straight into the tensor's storage: one copy, even for multi-GB files.
        buf = torch.empty(n_bytes, dtype=torch.uint8)
        if n_bytes and self.f.readinto(buf.numpy()) != n_bytes:
            raise _Truncated()
        return buf.view(dtype).reshape(shape)


def read_model_bin(path: Path) -> Tuple[str, int, Dict[str, torch.Tensor]]:
    """(spec name, spec revision, variables) with aliases resolved to the same tensor."""
    try:
        with open(path, "rb") as f:
            return _read(_Reader(f, os.fstat(f.fileno()).st_size), path)
    except _Truncated:
        raise ModelLoadError(f"{path} is truncated or corrupt (unexpected end of file)") from None
    except (UnicodeDecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{path} is corrupt: {e}") from None


def _read(r: _Reader, path: Path) -> Tuple[str, int, Dict[str, torch.Tensor]]:
    version = r.u32()
    if not 1 <= version <= _MAX_BINARY_VERSION:
        raise UnsupportedCheckpointError(
            f"{path} has CTranslate2 binary version {version}; supported: 1..{_MAX_BINARY_VERSION}"
        )
    spec, revision = ("", 1) if version < 2 else (r.string(), r.u32())
    variables: Dict[str, torch.Tensor] = {}
    for _ in range(r.u32()):
        name = r.string()
        shape = tuple(r.u32() for _ in range(r.u8()))
        numel = 1
        for dim in shape:
            numel *= dim
        if version >= 4:
            type_id = r.u8()
            if type_id >= len(_DTYPES):
                raise ModelLoadError(f"{path} is corrupt: unknown dtype id {type_id} for {name}")
            dtype, n_bytes = _DTYPES[type_id], r.u32()
        else:
            item_size = r.u8()
            if item_size not in _LEGACY_DTYPES:
                raise ModelLoadError(f"{path} is corrupt: item size {item_size} for {name}")
            dtype, n_bytes = _LEGACY_DTYPES[item_size], r.u32() * item_size
        if n_bytes != numel * dtype.itemsize:
            raise ModelLoadError(
                f"{path} is corrupt: {name} has {n_bytes} bytes for shape {list(shape)} {dtype}"
            )
        variables[name] = r.tensor(shape, dtype, n_bytes)
    if version >= 3:
        for _ in range(r.u32()):
            alias, target = r.string(), r.string()
            if target in variables:
                variables[alias] = variables[target]
                # ctranslate2 also aliases the quantization scale of the target.
                if target + "_scale" in variables:
                    variables[alias + "_scale"] = variables[target + "_scale"]
    return spec, revision, variables


def _count_layers(variables: Dict[str, torch.Tensor], scope: str) -> int:
    pattern = re.compile(re.escape(scope) + r"/layer_(\d+)/")
    found = {int(m.group(1)) for name in variables for m in [pattern.match(name)] if m}
    return max(found) + 1 if found else 0


class _Weights:
    """Access to model.bin variables with quantized weights turned back into floats."""

    def __init__(self, variables: Dict[str, torch.Tensor], path: Path):
        self.v = variables
        self.path = path
        floats = [t.dtype for n, t in variables.items() if t.dtype in _FLOATS and t.dim() > 0]
        # Dequantized weights take the dtype of the model's other floats (biases, norms),
        # so an int8_float16 model yields a float16 state dict rather than a mix.
        self.float_dtype = max(set(floats), key=floats.count) if floats else torch.float32

    def get(self, name: str) -> torch.Tensor:
        if name not in self.v:
            raise ModelLoadError(f"{self.path} has no variable {name}: not a Whisper model.bin?")
        t = self.v[name]
        if t.dtype in _FLOATS:
            return t
        if name + "_zero" in self.v:
            raise UnsupportedCheckpointError(
                f"{self.path}: {name} uses zero-point (AWQ/4-bit) quantization, which is not supported"
            )
        if t.dtype not in (torch.int8, torch.int16) or name + "_scale" not in self.v:
            raise UnsupportedCheckpointError(
                f"{self.path}: {name} is stored as {str(t.dtype).replace('torch.', '')}"
                " without a quantization scale, which is not supported"
            )
        return (t.float() * (1.0 / self._scale_for(name, t))).to(self.float_dtype)

    def _scale_for(self, name: str, t: torch.Tensor) -> torch.Tensor:
        # ctranslate2 quantizes with q = rint(w * scale) and dequantizes with
        # q * (1 / scale) in float32. int16 uses one scalar scale; int8 one scale per
        # output row (the Python converter flattens conv weights [out, in, k] to rows).
        scale = self.v[name + "_scale"].float()
        if scale.numel() == 1:
            return scale.reshape(())
        if scale.numel() == t.shape[0]:
            return scale.reshape((t.shape[0],) + (1,) * (t.dim() - 1))
        if scale.numel() * t.shape[-1] == t.numel():
            return scale.reshape(t.shape[:-1] + (1,))
        raise UnsupportedCheckpointError(
            f"{self.path}: {name}_scale has {scale.numel()} values for a weight of shape "
            f"{list(t.shape)} (unknown quantization layout)"
        )


def _split_rows(t: torch.Tensor, parts: int):
    return torch.chunk(t, parts, dim=0)


def _attention(w: _Weights, scope: str, out: str, sd: Dict[str, torch.Tensor], cross: bool):
    if cross:
        # Cross-attention: linear_0 = query, linear_1 = fused [key; value], linear_2 = out.
        q_w, q_b = w.get(f"{scope}/linear_0/weight"), w.get(f"{scope}/linear_0/bias")
        k_w, v_w = _split_rows(w.get(f"{scope}/linear_1/weight"), 2)
        _, v_b = _split_rows(w.get(f"{scope}/linear_1/bias"), 2)
        o = "linear_2"
    else:
        # Self-attention: linear_0 = fused [query; key; value], linear_1 = out.
        q_w, k_w, v_w = _split_rows(w.get(f"{scope}/linear_0/weight"), 3)
        q_b, _, v_b = _split_rows(w.get(f"{scope}/linear_0/bias"), 3)
        o = "linear_1"
    # The fused key bias is zeros written by the converter (Whisper's key has no bias);
    # dropping it is exact either way since softmax ignores a per-query constant.
    sd[f"{out}.query.weight"], sd[f"{out}.query.bias"] = q_w, q_b
    sd[f"{out}.key.weight"] = k_w
    sd[f"{out}.value.weight"], sd[f"{out}.value.bias"] = v_w, v_b
    sd[f"{out}.out.weight"] = w.get(f"{scope}/{o}/weight")
    sd[f"{out}.out.bias"] = w.get(f"{scope}/{o}/bias")


def _norm(w: _Weights, scope: str, out: str, sd: Dict[str, torch.Tensor]):
    sd[f"{out}.weight"] = w.get(f"{scope}/gamma")
    sd[f"{out}.bias"] = w.get(f"{scope}/beta")


def _linear(w: _Weights, scope: str, out: str, sd: Dict[str, torch.Tensor]):
    sd[f"{out}.weight"] = w.get(f"{scope}/weight")
    sd[f"{out}.bias"] = w.get(f"{scope}/bias")


def _block(w: _Weights, scope: str, out: str, sd: Dict[str, torch.Tensor], cross: bool):
    _attention(w, f"{scope}/self_attention", f"{out}.attn", sd, cross=False)
    _norm(w, f"{scope}/self_attention/layer_norm", f"{out}.attn_ln", sd)
    if cross:
        _attention(w, f"{scope}/attention", f"{out}.cross_attn", sd, cross=True)
        _norm(w, f"{scope}/attention/layer_norm", f"{out}.cross_attn_ln", sd)
    _norm(w, f"{scope}/ffn/layer_norm", f"{out}.mlp_ln", sd)
    _linear(w, f"{scope}/ffn/linear_0", f"{out}.mlp.0", sd)
    _linear(w, f"{scope}/ffn/linear_1", f"{out}.mlp.2", sd)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    # Row chunks of a fused tensor share its storage; give each its own so a later
    # in-place cast or free of one does not drag the fused buffer along.
    return t.clone() if t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes else t


def _scalar(variables: Dict[str, torch.Tensor], name: str) -> Optional[int]:
    t = variables.get(name)
    return int(t.item()) if t is not None and t.numel() == 1 else None


def load_ct2(directory: Path) -> WhisperCheckpoint:
    directory = Path(directory)
    path = directory / "model.bin"
    spec, revision, v = read_model_bin(path)
    if spec and spec != "WhisperSpec":
        raise UnsupportedCheckpointError(f"{path} holds a CTranslate2 {spec}, not a WhisperSpec")
    if revision > _MAX_WHISPER_REVISION:
        raise UnsupportedCheckpointError(
            f"{path} has WhisperSpec revision {revision}; supported: 1..{_MAX_WHISPER_REVISION}"
        )
    w = _Weights(v, path)

    sd: Dict[str, torch.Tensor] = {}
    _linear(w, "encoder/conv1", "encoder.conv1", sd)
    _linear(w, "encoder/conv2", "encoder.conv2", sd)
    sd["encoder.positional_embedding"] = w.get("encoder/position_encodings/encodings")
    n_audio_layer = _count_layers(v, "encoder")
    for i in range(n_audio_layer):
        _block(w, f"encoder/layer_{i}", f"encoder.blocks.{i}", sd, cross=False)
    _norm(w, "encoder/layer_norm", "encoder.ln_post", sd)

    sd["decoder.token_embedding.weight"] = w.get("decoder/embeddings/weight")
    sd["decoder.positional_embedding"] = w.get("decoder/position_encodings/encodings")
    n_text_layer = _count_layers(v, "decoder")
    for i in range(n_text_layer):
        _block(w, f"decoder/layer_{i}", f"decoder.blocks.{i}", sd, cross=True)
    _norm(w, "decoder/layer_norm", "decoder.ln", sd)
    _check_tied_projection(w, v, path)
    sd = {k: _contiguous(t) for k, t in sd.items()}

    conv1 = sd["encoder.conv1.weight"]
    embedding = sd["decoder.token_embedding.weight"]
    n_audio_state, n_text_state = conv1.shape[0], embedding.shape[1]
    dims = WhisperDims(
        n_mels=conv1.shape[1],
        n_audio_ctx=sd["encoder.positional_embedding"].shape[0],
        n_audio_state=n_audio_state,
        # Revisions >= 2 store the head counts as scalars; older files need a guess.
        n_audio_head=_scalar(v, "encoder/num_heads") or guess_heads(n_audio_state),
        n_audio_layer=n_audio_layer,
        n_vocab=embedding.shape[0],
        n_text_ctx=sd["decoder.positional_embedding"].shape[0],
        n_text_state=n_text_state,
        n_text_head=_scalar(v, "decoder/num_heads") or guess_heads(n_text_state),
        n_text_layer=n_text_layer,
    )
    check_state_dict(dims, sd, str(path))

    tokenizer = directory / "tokenizer.json"
    return WhisperCheckpoint(
        dims=dims,
        state_dict=sd,
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
        alignment_heads=_alignment_heads(directory / "config.json"),
        source="ctranslate2",
        path=str(directory),
    )


def _check_tied_projection(w: _Weights, v: Dict[str, torch.Tensor], path: Path):
    """Whisper ties its output projection to the token embedding; refuse files that do not."""
    if "decoder/projection/bias" in v:
        raise UnsupportedCheckpointError(f"{path}: the output projection has a bias (not Whisper's)")
    proj = v.get("decoder/projection/weight")
    emb = v.get("decoder/embeddings/weight")
    if proj is None or proj is emb:
        return
    if not torch.equal(w.get("decoder/projection/weight"), w.get("decoder/embeddings/weight")):
        raise UnsupportedCheckpointError(
            f"{path}: the output projection is not tied to the token embedding"
        )


def _alignment_heads(config_path: Path):
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{config_path} is not valid JSON: {e}") from None
    return normalize_alignment_heads(config.get("alignment_heads") if isinstance(config, dict) else None)
