"""The canonical in-memory Whisper checkpoint every loader produces.

Whatever the on-disk format (CTranslate2, Hugging Face, OpenAI), loaders return the
weights under OpenAI's parameter names with separate q/k/v projections, so the model
code has exactly one layout to understand.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from ostinato.errors import ModelLoadError
from ostinato.models.whisper.config import WhisperDims


@dataclass
class WhisperCheckpoint:
    dims: WhisperDims
    # OpenAI parameter names, CPU tensors, dtype as stored (float16/float32/bfloat16).
    state_dict: Dict[str, torch.Tensor]
    tokenizer_file: Optional[Path]
    alignment_heads: Optional[List[Tuple[int, int]]]
    source: str  # "ctranslate2" | "huggingface" | "openai"
    path: str


def _attention_shapes(prefix: str, d: int) -> Dict[str, Tuple[int, ...]]:
    # Whisper's key projection has no bias: a bias on k shifts every score of a query
    # by the same amount, which softmax cancels.
    return {
        f"{prefix}.query.weight": (d, d),
        f"{prefix}.query.bias": (d,),
        f"{prefix}.key.weight": (d, d),
        f"{prefix}.value.weight": (d, d),
        f"{prefix}.value.bias": (d,),
        f"{prefix}.out.weight": (d, d),
        f"{prefix}.out.bias": (d,),
    }


def _block_shapes(prefix: str, d: int, cross: bool) -> Dict[str, Tuple[int, ...]]:
    shapes = _attention_shapes(f"{prefix}.attn", d)
    norms = ["attn_ln", "mlp_ln"]
    if cross:
        shapes.update(_attention_shapes(f"{prefix}.cross_attn", d))
        norms.append("cross_attn_ln")
    for ln in norms:
        shapes[f"{prefix}.{ln}.weight"] = (d,)
        shapes[f"{prefix}.{ln}.bias"] = (d,)
    shapes[f"{prefix}.mlp.0.weight"] = (4 * d, d)
    shapes[f"{prefix}.mlp.0.bias"] = (4 * d,)
    shapes[f"{prefix}.mlp.2.weight"] = (d, 4 * d)
    shapes[f"{prefix}.mlp.2.bias"] = (d,)
    return shapes


def expected_shapes(dims: WhisperDims) -> Dict[str, Tuple[int, ...]]:
    """Every parameter of an OpenAI-layout Whisper model with its shape."""
    da, dt = dims.n_audio_state, dims.n_text_state
    shapes: Dict[str, Tuple[int, ...]] = {
        "encoder.conv1.weight": (da, dims.n_mels, 3),
        "encoder.conv1.bias": (da,),
        "encoder.conv2.weight": (da, da, 3),
        "encoder.conv2.bias": (da,),
        "encoder.positional_embedding": (dims.n_audio_ctx, da),
        "encoder.ln_post.weight": (da,),
        "encoder.ln_post.bias": (da,),
        "decoder.token_embedding.weight": (dims.n_vocab, dt),
        "decoder.positional_embedding": (dims.n_text_ctx, dt),
        "decoder.ln.weight": (dt,),
        "decoder.ln.bias": (dt,),
    }
    for i in range(dims.n_audio_layer):
        shapes.update(_block_shapes(f"encoder.blocks.{i}", da, cross=False))
    for i in range(dims.n_text_layer):
        shapes.update(_block_shapes(f"decoder.blocks.{i}", dt, cross=True))
    return shapes


def check_state_dict(dims: WhisperDims, state_dict: Dict[str, torch.Tensor], path: str) -> None:
    """Raise ModelLoadError (one line) unless state_dict matches dims exactly.

    Done once for every format so that a mapping bug or an odd checkpoint fails here,
    naming the tensor, instead of as a shape error deep inside the model.
    """
    expected = expected_shapes(dims)
    missing = [k for k in expected if k not in state_dict]
    if missing:
        raise ModelLoadError(
            f"checkpoint at {path} is missing {len(missing)} Whisper tensor(s), e.g. {missing[0]}"
        )
    unexpected = [k for k in state_dict if k not in expected]
    if unexpected:
        raise ModelLoadError(
            f"checkpoint at {path} has {len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}"
        )
    for name, shape in expected.items():
        if not isinstance(state_dict[name], torch.Tensor):
            raise ModelLoadError(f"checkpoint at {path}: {name} is not a tensor")
        got = tuple(state_dict[name].shape)
        if got != shape:
            raise ModelLoadError(
                f"checkpoint at {path}: tensor {name} has shape {list(got)}, expected {list(shape)}"
            )


def read_torch_file(path: Path):
    """``torch.load`` of a file of tensors, memory-mapped: the tensors read the page cache when they
    are copied to the device instead of first being read into memory (a 3.1-GB large-v3 checkpoint
    on the H200 machine: 2.05 s to the GPU, 0.5 s mapped). Files in the pre-1.6 format cannot be
    mapped and are read. ``weights_only``: a pickle from anywhere must not run code."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        return torch.load(str(path), map_location="cpu", weights_only=True)


def guess_heads(n_state: int) -> int:
    """Head count for files that do not store it.

    Shapes do not determine the head count; every official Whisper size uses heads of
    64 dimensions (384 -> 6, ..., 1280 -> 20), so assume that.
    """
    return max(1, n_state // 64)


def normalize_alignment_heads(value) -> Optional[List[Tuple[int, int]]]:
    """[[layer, head], ...] from a JSON config -> list of tuples; None when absent/invalid."""
    if not value:
        return None
    try:
        return [(int(layer), int(head)) for layer, head in value]
    except (TypeError, ValueError):
        return None
