"""``load_model``: one entry point for every family, chosen from what the checkpoint holds.

The file name says nothing here: a NeMo archive is a tar holding ``model_config.yaml`` whatever it
is called, a Whisper checkpoint is a CTranslate2 or Hugging Face folder, an OpenAI ``.pt`` or a hub
id, and a decoder-only language model is a Hugging Face folder whose config names a causal LM.
Model classes are imported only once the family is known, so detection stays cheap.
"""
from __future__ import annotations

import json
import logging
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Optional, Union

from .errors import ModelLoadError, UnsupportedCheckpointError

log = logging.getLogger(__name__)

WHISPER, TRANSDUCER, LANGUAGE_MODEL = "whisper", "transducer", "language model"
_NEMO_CONFIG = "model_config.yaml"
_CLASSES = {WHISPER: "WhisperModel", TRANSDUCER: "TransducerModel", LANGUAGE_MODEL: "LanguageModel"}
_NAMES = {WHISPER: "Whisper", TRANSDUCER: "NeMo transducer", LANGUAGE_MODEL: "decoder-only language model"}


def is_nemo_archive(path: Union[str, os.PathLike]) -> bool:
    """A tar archive (compressed or not) with NeMo's ``model_config.yaml`` among its members."""
    try:
        if not os.path.isfile(path) or not tarfile.is_tarfile(path):
            return False
        with tarfile.open(path, "r:*") as tar:
            return any(name.rsplit("/", 1)[-1].endswith(_NEMO_CONFIG) for name in tar.getnames())
    except (tarfile.TarError, EOFError, OSError, ValueError):
        return False


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, ValueError):
        return False


def _config(folder: Path) -> Optional[dict]:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _is_language_model(config: dict) -> bool:
    """A Hugging Face config of a decoder-only text model (Whisper's says ``whisper``)."""
    if config.get("model_type") == "whisper":
        return False
    names = config.get("architectures") or []
    return any(str(name).endswith(("ForCausalLM", "ForConditionalGeneration")) for name in names)


def _is_whisper_folder(folder: Path) -> bool:
    if (folder / "model.bin").is_file():  # CTranslate2: faster-whisper's format
        return True
    config = _config(folder)
    return config is not None and config.get("model_type") == "whisper"


def check_model_name(path_or_id: Union[str, os.PathLike]) -> None:
    """An empty model path or id raises ``ModelLoadError`` (every family's loader asks this first)."""
    if not os.fspath(path_or_id).strip():
        raise ModelLoadError("the model path or id is empty: leave it out for the embedded default model")


def checkpoint_family(path_or_id: Union[str, os.PathLike, None]) -> Optional[str]:
    """The family whose class loads ``path_or_id`` ("whisper", "transducer", "language model"), or
    None when a local file or folder holds nothing a family recognises.

    None (the embedded default) and names that are no local path (hub ids) are Whisper's, and so
    is a torch checkpoint file (OpenAI's ``.pt`` is a zip archive). An empty name raises
    ``ModelLoadError``."""
    if path_or_id is None:
        return WHISPER
    check_model_name(path_or_id)
    path = Path(os.fspath(path_or_id)).expanduser()
    if not path.exists():
        return WHISPER
    if path.is_file():
        if _is_tar(path):  # NeMo's archive format; one without NeMo's config is nobody's
            return TRANSDUCER if is_nemo_archive(path) else None
        if zipfile.is_zipfile(path):
            return WHISPER
        if path.name not in ("config.json", "model.bin") and path.suffix != ".safetensors":
            return None
        path = path.parent  # a file inside a checkpoint folder names the folder
    if _is_whisper_folder(path) or any(path.glob("*.pt")):
        return WHISPER
    config = _config(path)
    if config is not None and _is_language_model(config):
        return LANGUAGE_MODEL
    if (path / "config.json").exists() or any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").exists():
        return WHISPER  # a Hugging Face folder that is no language model: Whisper's loader says what is wrong
    return None


def wrong_family(path: Union[str, os.PathLike], family: str) -> UnsupportedCheckpointError:
    """The error a family's class raises for a checkpoint of another family."""
    return UnsupportedCheckpointError(
        f"{os.fspath(path)} is a {_NAMES[family]} checkpoint: load it with ostinato.{_CLASSES[family]} "
        "or ostinato.load_model"
    )


def load_model(path_or_id: Union[str, os.PathLike, None] = None, **kwargs):
    """The model for ``path_or_id`` (None: the embedded Whisper tiny.en), of whichever family the
    checkpoint's contents say; keyword arguments go to that family's class (``device``,
    ``compute_type``, ``decode_loop``, ``use_graphs``, ``cpu_threads``...). What it chose (family,
    checkpoint, device, dtype, decode loop; on the CPU the threads and, for speech, the layout of the
    decode step's weights) is logged at INFO, in one line."""
    family = checkpoint_family(path_or_id)
    if family is None:
        raise UnsupportedCheckpointError(
            f"{os.fspath(path_or_id)} holds no checkpoint ostinato knows: expected a Whisper checkpoint "
            "(CTranslate2 or Hugging Face folder, OpenAI .pt), a NeMo transducer (.nemo archive) or a "
            "Hugging Face causal language model folder"
        )
    if family == LANGUAGE_MODEL:
        from .models.llm.model import LanguageModel

        from .runtime import set_cpu_threads

        kwargs = dict(kwargs)
        if "compute_type" in kwargs:  # the speech classes' name for it
            kwargs["dtype"] = kwargs.pop("compute_type")
        threads = kwargs.pop("cpu_threads", 0)
        if threads != 0:  # the speech classes take cpu_threads; LanguageModel does not, so it is set here
            set_cpu_threads(threads)
        model = LanguageModel(os.fspath(path_or_id), **kwargs)
        log.info("%s model %s (%s) on %s, %s; decode loop: %s%s", _NAMES[family], model.path,
                 model.config.architecture, model.device, str(model.dtype).replace("torch.", ""), model.decode_loop,
                 _threads(model.device))
        return model
    if family == TRANSDUCER:
        from .models.transducer.model import TransducerModel as model_class
    else:
        from .models.whisper.model import WhisperModel as model_class
    model = model_class(path_or_id, **kwargs)
    log.info("%s model %s on %s, %s; decode loop: %s%s%s", _NAMES[family], model.model_path, model.device,
             str(model.dtype).replace("torch.", ""), model.decoder.loop_rung, _threads(model.device),
             _step_weights(model.device))
    return model


def _step_weights(device) -> str:
    """The log line's layout of a speech model's decode-step weights, MKL's reproducibility mode
    (what keeps each row alone) and how a lone row runs, on the CPU only (``ops.cpu_linear``)."""
    import torch

    from .ops import cpu_linear

    if torch.device(device).type != "cpu":
        return ""
    layout = "in-major" if cpu_linear.in_major_preferred(device) else "out-major"
    return (f"; step weights {layout}, MKL strict reproducibility {cpu_linear.reproducibility()}, "
            f"a lone row {cpu_linear.lone_rows(layout)}")


def _threads(device) -> str:
    """The log line's CPU thread count, on the CPU only."""
    import torch

    return f"; CPU threads: {torch.get_num_threads()}" if torch.device(device).type == "cpu" else ""
