"""Hugging Face `WhisperForConditionalGeneration` directories (config.json + safetensors)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ostinato.errors import ModelLoadError, UnsupportedCheckpointError
from ostinato.models.whisper.config import WhisperDims
from ostinato.models.whisper.loaders.checkpoint import (
    WhisperCheckpoint,
    check_state_dict,
    normalize_alignment_heads,
    read_torch_file,
)

INDEX_FILE = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"

# HF name pieces -> OpenAI ones, applied in order (longer, more specific patterns first).
_RENAMES = [
    (r"^encoder\.embed_positions\.weight$", "encoder.positional_embedding"),
    (r"^decoder\.embed_positions\.weight$", "decoder.positional_embedding"),
    (r"^decoder\.embed_tokens\.", "decoder.token_embedding."),
    (r"^encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^decoder\.layer_norm\.", "decoder.ln."),
    (r"\.layers\.", ".blocks."),
    (r"\.self_attn_layer_norm\.", ".attn_ln."),
    (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
    (r"\.final_layer_norm\.", ".mlp_ln."),
    (r"\.self_attn\.", ".attn."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.q_proj\.", ".query."),
    (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."),
    (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".mlp.0."),
    (r"\.fc2\.", ".mlp.2."),
]
_RENAMES = [(re.compile(p), r) for p, r in _RENAMES]


def to_openai_name(name: str) -> str:
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def weight_files(directory: Path) -> List[Path]:
    """The safetensors files of a checkpoint: from the shard index, else model.safetensors."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index} has no weight_map")
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{directory} is missing shard {missing[0]} listed in {INDEX_FILE}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(directory.glob("*.safetensors"))


def _load_tensors(directory: Path) -> Dict[str, torch.Tensor]:
    files = weight_files(directory)
    if files:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        tensors: Dict[str, torch.Tensor] = {}
        for f in files:
            try:
                tensors.update(load_file(str(f), device="cpu"))
            except (SafetensorError, OSError, ValueError) as e:
                raise ModelLoadError(f"cannot read {f}: {e}") from None
        return tensors
    bin_file = directory / TORCH_BIN
    if bin_file.is_file():
        # Older HF checkpoints
        try:
            return read_torch_file(bin_file)
        except Exception as e:  # torch raises many types for a bad pickle
            raise ModelLoadError(f"cannot read {bin_file}: {type(e).__name__}: {e}".splitlines()[0]) from None
    raise ModelLoadError(
        f"{directory} has a config.json but no weights (model.safetensors, {INDEX_FILE} or {TORCH_BIN})"
    )


def _dims(config: dict, path: Path) -> WhisperDims:
    keys = {
        "n_mels": "num_mel_bins",
        "n_audio_ctx": "max_source_positions",
        "n_audio_state": "d_model",
        "n_audio_head": "encoder_attention_heads",
        "n_audio_layer": "encoder_layers",
        "n_vocab": "vocab_size",
        "n_text_ctx": "max_target_positions",
        "n_text_state": "d_model",
        "n_text_head": "decoder_attention_heads",
        "n_text_layer": "decoder_layers",
    }
    missing = [hf for hf in keys.values() if not isinstance(config.get(hf), int)]
    if missing:
        raise ModelLoadError(f"{path} lacks Whisper config key {missing[0]}")
    return WhisperDims(**{ours: config[hf] for ours, hf in keys.items()})


def load_huggingface(directory: Path) -> WhisperCheckpoint:
    directory = Path(directory)
    config_path = directory / "config.json"
    config = _read_json(config_path)
    model_type = config.get("model_type")
    if model_type != "whisper":
        raise UnsupportedCheckpointError(
            f"{config_path} describes a '{model_type}' model, not Whisper (model_type 'whisper')"
        )
    dims = _dims(config, config_path)

    state_dict: Dict[str, torch.Tensor] = {}
    proj_out: Optional[torch.Tensor] = None
    for name, tensor in _load_tensors(directory).items():
        if name == "proj_out.weight":
            proj_out = tensor
            continue
        # WhisperForConditionalGeneration prefixes "model."; a bare WhisperModel does not.
        name = name[len("model."):] if name.startswith("model.") else name
        state_dict[to_openai_name(name)] = tensor
    embedding = state_dict.get("decoder.token_embedding.weight")
    if proj_out is not None and embedding is not None and not torch.equal(proj_out, embedding):
        raise UnsupportedCheckpointError(
            f"{directory}: proj_out is not tied to the token embedding (not a standard Whisper)"
        )
    check_state_dict(dims, state_dict, str(directory))

    alignment_heads = None
    gen_config = directory / "generation_config.json"
    if gen_config.is_file():
        alignment_heads = normalize_alignment_heads(_read_json(gen_config).get("alignment_heads"))
    tokenizer = directory / "tokenizer.json"
    return WhisperCheckpoint(
        dims=dims,
        state_dict=state_dict,
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
        alignment_heads=alignment_heads,
        source="huggingface",
        path=str(directory),
    )
