"""Turn any supported Whisper checkpoint into one canonical `WhisperCheckpoint`.

    load_checkpoint("path/to/ct2_dir")          CTranslate2 (model.bin)
    load_checkpoint("path/to/hf_dir")           Hugging Face (config.json + safetensors)
    load_checkpoint("path/to/model.pt")         OpenAI
    load_checkpoint("tiny.en") / ("org/name")   Hugging Face hub (cache first)
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from ostinato.errors import ModelLoadError
from ostinato.loading import LANGUAGE_MODEL, TRANSDUCER, check_model_name, checkpoint_family, wrong_family
from ostinato.models.whisper.loaders import hub
from ostinato.models.whisper.loaders.checkpoint import WhisperCheckpoint

__all__ = ["WhisperCheckpoint", "load_checkpoint"]

_PATH_SUFFIXES = (".pt", ".bin", ".nemo", ".safetensors")


def load_checkpoint(path_or_id: str) -> WhisperCheckpoint:
    text = os.fspath(path_or_id)
    check_model_name(text)
    path = Path(text).expanduser()
    if path.exists():
        return _load_local(path)
    if _looks_like_path(text):
        raise ModelLoadError(f"model path does not exist: {text}")
    if text and hub.is_hub_id(text):
        return _load_local(hub.download(text))
    raise _not_found(text)


def _looks_like_path(text: str) -> bool:
    if text.startswith((".", "~", os.sep)) or text.lower().endswith(_PATH_SUFFIXES):
        return True
    if os.altsep and os.altsep in text:
        return True
    # "org/name" has a separator too but is a hub id; anything deeper is a path.
    return os.sep in text and not hub.is_hub_id(text)


def _not_found(where) -> ModelLoadError:
    return ModelLoadError(
        f"no Whisper checkpoint found at {where}: expected a CTranslate2 dir (model.bin), "
        "a Hugging Face dir (config.json + safetensors) or an OpenAI .pt file"
    )


def _load_local(path: Path) -> WhisperCheckpoint:
    family = checkpoint_family(path)
    if family in (TRANSDUCER, LANGUAGE_MODEL):
        raise wrong_family(path, family)
    if path.is_file():
        if path.name == "model.bin" or path.suffix == ".safetensors":
            return _load_local(path.parent)  # a file inside a checkpoint dir names the dir
        if path.suffix == ".pt" or zipfile.is_zipfile(path):  # torch's format, whatever the name
            from ostinato.models.whisper.loaders.openai import load_openai

            return load_openai(path)
        raise _not_found(path)
    if not path.is_dir():
        raise _not_found(path)

    if (path / "model.bin").is_file():
        from ostinato.models.whisper.loaders.ct2 import load_ct2

        return load_ct2(path)
    if (path / "config.json").is_file() and _is_hf_dir(path):
        from ostinato.models.whisper.loaders.huggingface import load_huggingface

        return load_huggingface(path)
    pts = sorted(path.glob("*.pt"))
    if len(pts) == 1:
        from ostinato.models.whisper.loaders.openai import load_openai

        return load_openai(pts[0])
    if len(pts) > 1:
        names = ", ".join(p.name for p in pts[:3])
        raise ModelLoadError(f"{path} holds several .pt files ({names}): pass one of them")
    raise _not_found(path)


def _is_hf_dir(path: Path) -> bool:
    """Weights in HF layout, or a config.json declaring a model_type (so a non-Whisper
    model is refused by name instead of as "no checkpoint found")."""
    if any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").is_file():
        return True
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config
