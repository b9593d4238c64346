"""OpenAI `.pt` checkpoints: {"dims": {...}, "model_state_dict": {...}} as openai-whisper saves them."""
from __future__ import annotations

import base64
import dataclasses
import gzip
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from ostinato.errors import ModelLoadError
from ostinato.models.whisper.config import WhisperDims
from ostinato.models.whisper.loaders.checkpoint import (
    WhisperCheckpoint,
    check_state_dict,
    normalize_alignment_heads,
    read_torch_file,
)
from ostinato.models.whisper.loaders.vocab import find_tokenizer


def load_openai(path: Path) -> WhisperCheckpoint:
    path = Path(path)
    try:
        data = read_torch_file(path)
    except Exception as e:  # zipfile, pickle, EOF and runtime errors all mean "unreadable"
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelLoadError(
            f"cannot read OpenAI checkpoint {path}: {type(e).__name__}" + (f": {detail}" if detail else "")
        ) from None
    if not isinstance(data, dict) or "dims" not in data or "model_state_dict" not in data:
        raise ModelLoadError(
            f"{path} is not an OpenAI Whisper checkpoint (expected keys 'dims' and 'model_state_dict')"
        )
    dims = _dims(data["dims"], path)
    state_dict = data["model_state_dict"]
    if not isinstance(state_dict, dict):
        raise ModelLoadError(f"{path}: model_state_dict is not a dict of tensors")
    # openai-whisper registers alignment_heads as a non-persistent buffer; drop any copy.
    state_dict = {k: v for k, v in state_dict.items() if k != "alignment_heads"}
    check_state_dict(dims, state_dict, str(path))
    return WhisperCheckpoint(
        dims=dims,
        state_dict=state_dict,
        tokenizer_file=find_tokenizer(path.parent, dims.n_vocab),
        alignment_heads=_alignment_heads(data.get("alignment_heads"), dims),
        source="openai",
        path=str(path),
    )


def _dims(raw, path: Path) -> WhisperDims:
    names = [f.name for f in dataclasses.fields(WhisperDims)]
    if not isinstance(raw, dict) or any(not isinstance(raw.get(n), int) for n in names):
        raise ModelLoadError(f"{path}: 'dims' must hold the integers {', '.join(names)}")
    return WhisperDims(**{n: raw[n] for n in names})


def _alignment_heads(raw, dims: WhisperDims) -> Optional[List[Tuple[int, int]]]:
    """Alignment heads only if the file carries them (official .pt files do not).

    Accepts a [[layer, head], ...] list, a boolean [n_text_layer, n_text_head] mask (dense or
    sparse, as openai-whisper keeps it), or openai-whisper's base85-encoded gzip of that mask.
    """
    if raw is None:
        return None
    if isinstance(raw, (bytes, str)):
        try:
            raw = torch.frombuffer(bytearray(gzip.decompress(base64.b85decode(raw))), dtype=torch.bool)
        except (ValueError, OSError, EOFError):
            return None
    if isinstance(raw, torch.Tensor):
        mask = raw.to_dense() if raw.is_sparse else raw
        if mask.numel() != dims.n_text_layer * dims.n_text_head:
            return None
        mask = mask.reshape(dims.n_text_layer, dims.n_text_head).bool()
        return [(int(layer), int(head)) for layer, head in mask.nonzero().tolist()]
    return normalize_alignment_heads(raw)
