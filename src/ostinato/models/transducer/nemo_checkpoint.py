"""Reading NeMo ``.nemo`` transducer checkpoints without importing NeMo.

A ``.nemo`` file is a tar archive (plain or gzip) holding ``model_config.yaml``, ``model_weights.ckpt``
(a torch state dict) and the tokenizer's files, referred to from the config as ``nemo:<name>``.
Supported: FastConformer (``ConformerEncoder`` with ``dw_striding`` subsampling, ``rel_pos``
attention, full context) with an LSTM ``RNNTDecoder`` and ``RNNTJoint``, as RNN-T or TDT
(``EncDecRNNTBPEModel`` and the RNN-T half of ``EncDecHybridRNNTCTCBPEModel``), with a SentencePiece
tokenizer. Anything else raises ``UnsupportedCheckpointError`` naming what is missing or unsupported.
"""
from __future__ import annotations

import io
import math
import os
import tarfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from ...audio.decode import SAMPLE_RATE
from ...errors import ModelLoadError, UnsupportedCheckpointError
from ...loading import LANGUAGE_MODEL, WHISPER, check_model_name, checkpoint_family, wrong_family
from .tokenizer import SentencePieceDecoder

CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"
NEMO_WINDOW_SIZE, NEMO_WINDOW_STRIDE = 0.02, 0.01  # seconds: NeMo's preprocessor defaults
_MODEL_TARGETS = ("EncDecRNNTBPEModel", "EncDecHybridRNNTCTCBPEModel", "EncDecRNNTModel", "EncDecHybridRNNTCTCModel")


@dataclass
class PreprocessorConfig:
    sample_rate: int = SAMPLE_RATE
    win_length: int = round(0.025 * SAMPLE_RATE)  # Parakeet's 25-ms window
    hop_length: int = round(NEMO_WINDOW_STRIDE * SAMPLE_RATE)
    n_fft: int = 512
    window: str = "hann"
    features: int = 80
    normalize: str = "per_feature"
    preemph: Optional[float] = 0.97
    log: bool = True
    log_zero_guard_type: str = "add"
    log_zero_guard_value: float = 2 ** -24
    mag_power: float = 2.0
    lowfreq: float = 0.0
    highfreq: Optional[float] = None
    mel_norm: Optional[str] = "slaney"
    pad_to: int = 0
    pad_value: float = 0.0


@dataclass
class EncoderConfig:
    feat_in: int
    n_layers: int
    d_model: int
    n_heads: int
    ff_expansion_factor: int = 4
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    conv_kernel_size: int = 9
    xscaling: bool = True
    untie_biases: bool = True
    use_bias: bool = True

    @property
    def d_ff(self) -> int:
        return self.d_model * self.ff_expansion_factor


@dataclass
class TransducerConfig:
    preprocessor: PreprocessorConfig
    encoder: EncoderConfig
    vocab_size: int  # labels without the blank; blank id == vocab_size
    pred_hidden: int
    pred_layers: int
    joint_hidden: int
    joint_activation: str = "relu"
    durations: List[int] = field(default_factory=list)  # TDT when non-empty
    max_symbols: int = 10

    @property
    def is_tdt(self) -> bool:
        return bool(self.durations)

    @property
    def blank_id(self) -> int:
        return self.vocab_size

    @property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame (10 ms hop x 8 = 80 ms for FastConformer)."""
        pre = self.preprocessor
        return pre.hop_length * self.encoder.subsampling_factor / pre.sample_rate


@dataclass
class NemoCheckpoint:
    path: str
    config: TransducerConfig
    state_dict: Dict[str, torch.Tensor]
    tokenizer: SentencePieceDecoder
    raw_config: Dict[str, Any]


def _yaml():
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise ModelLoadError("reading .nemo checkpoints needs PyYAML: pip install pyyaml") from None
    return yaml


def _member_name(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def _read_archive(path: str) -> Dict[str, bytes]:
    check_model_name(path)
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: {path}")
    family = checkpoint_family(path)
    if family in (WHISPER, LANGUAGE_MODEL):
        raise wrong_family(path, family)
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a directory; a NeMo model is a single .nemo file")
    try:
        with tarfile.open(path, "r:*") as tar:
            files = {}
            for member in tar.getmembers():
                if member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        files[_member_name(member.name)] = handle.read()
            return files
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        reason = "not a tar archive" if isinstance(exc, tarfile.ReadError) else str(exc).splitlines()[0]
        raise ModelLoadError(
            f"{path} is not a readable .nemo archive (a .nemo file is a tar holding {CONFIG_NAME} and "
            f"{WEIGHTS_NAME}): {reason}"
        ) from None


def _find(files: Dict[str, bytes], name: str) -> Optional[str]:
    """The archive member called ``name`` (NeMo may put it in a folder or prefix it with a hash)."""
    for key in files:
        base = key.rsplit("/", 1)[-1]
        if base == name:
            return key
    for key in files:
        if key.rsplit("/", 1)[-1].endswith(name):
            return key
    return None


def _target(section: Any) -> str:
    if isinstance(section, dict):
        return str(section.get("_target_", "")).rsplit(".", 1)[-1]
    return ""


def _need(section: Dict[str, Any], key: str, where: str):
    if not isinstance(section, dict) or key not in section or section[key] is None:
        raise UnsupportedCheckpointError(f"model_config.yaml has no {where}.{key}")
    return section[key]


def parse_config(cfg: Dict[str, Any], path: str = "model") -> TransducerConfig:
    """Check that ``cfg`` (a parsed model_config.yaml) describes a supported transducer; build its config."""
    if not isinstance(cfg, dict):
        raise UnsupportedCheckpointError(f"{path}: model_config.yaml is not a mapping")
    target = str(cfg.get("target", "")).rsplit(".", 1)[-1]
    if target and target not in _MODEL_TARGETS:
        raise UnsupportedCheckpointError(
            f"{path}: unsupported NeMo model class {target!r}; supported: {', '.join(_MODEL_TARGETS)}"
        )
    for section in ("preprocessor", "encoder", "decoder", "joint"):
        if not isinstance(cfg.get(section), dict):
            raise UnsupportedCheckpointError(
                f"{path}: model_config.yaml has no '{section}' section; only transducer (RNN-T/TDT) models are supported"
            )

    pre = cfg["preprocessor"]
    if _target(pre) not in ("AudioToMelSpectrogramPreprocessor", ""):
        raise UnsupportedCheckpointError(f"{path}: unsupported preprocessor {_target(pre)!r}")
    sr = int(pre.get("sample_rate", cfg.get("sample_rate", SAMPLE_RATE)))
    win = pre.get("n_window_size") or int(float(pre.get("window_size", NEMO_WINDOW_SIZE)) * sr)
    hop = pre.get("n_window_stride") or int(float(pre.get("window_stride", NEMO_WINDOW_STRIDE)) * sr)
    if pre.get("exact_pad", False) or int(pre.get("frame_splicing", 1)) != 1:
        raise UnsupportedCheckpointError(f"{path}: preprocessor exact_pad / frame_splicing are not supported")
    normalize = pre.get("normalize", PreprocessorConfig.normalize)
    if normalize not in ("per_feature", None, "", False):
        raise UnsupportedCheckpointError(f"{path}: unsupported feature normalization {normalize!r} (only per_feature)")
    guard = pre.get("log_zero_guard_value", PreprocessorConfig.log_zero_guard_value)
    if isinstance(guard, str):
        raise UnsupportedCheckpointError(f"{path}: log_zero_guard_value {guard!r} is not supported")
    pad_to = pre.get("pad_to", 16)
    pre_cfg = PreprocessorConfig(
        sample_rate=sr,
        win_length=int(win),
        hop_length=int(hop),
        n_fft=int(pre.get("n_fft") or 2 ** math.ceil(math.log2(int(win)))),
        window=str(pre.get("window", PreprocessorConfig.window)),
        features=int(pre.get("features", pre.get("nfilt", 64))),
        normalize="per_feature" if normalize else "",
        preemph=pre.get("preemph", PreprocessorConfig.preemph),
        log=bool(pre.get("log", PreprocessorConfig.log)),
        log_zero_guard_type=str(pre.get("log_zero_guard_type", PreprocessorConfig.log_zero_guard_type)),
        log_zero_guard_value=float(guard),
        mag_power=float(pre.get("mag_power", PreprocessorConfig.mag_power)),
        lowfreq=float(pre.get("lowfreq") or PreprocessorConfig.lowfreq),
        highfreq=pre.get("highfreq"),
        mel_norm=pre.get("mel_norm", PreprocessorConfig.mel_norm),
        pad_to=0 if pad_to == "max" else int(pad_to or 0),
        pad_value=float(pre.get("pad_value", PreprocessorConfig.pad_value)),
    )
    if pre_cfg.window not in ("hann", "hamming", "blackman", "bartlett", "none"):
        raise UnsupportedCheckpointError(f"{path}: unsupported window {pre_cfg.window!r}")

    enc = cfg["encoder"]
    if _target(enc) != "ConformerEncoder":
        raise UnsupportedCheckpointError(
            f"{path}: unsupported encoder {_target(enc) or 'without _target_'!r}; only FastConformer (ConformerEncoder) is supported"
        )
    checks = {
        "subsampling": ("dw_striding", enc.get("subsampling", "striding")),
        "self_attention_model": ("rel_pos", enc.get("self_attention_model", "rel_pos")),
        "conv_norm_type": ("batch_norm", enc.get("conv_norm_type", "batch_norm")),
    }
    for key, (want, got) in checks.items():
        if got != want:
            raise UnsupportedCheckpointError(f"{path}: unsupported encoder {key} {got!r} (supported: {want!r})")
    context = enc.get("att_context_size") or [-1, -1]
    if list(context)[:2] != [-1, -1] and not (isinstance(context[0], list)):
        raise UnsupportedCheckpointError(f"{path}: limited attention context {context} is not supported (full context only)")
    if isinstance(context[0], list):
        raise UnsupportedCheckpointError(f"{path}: multi-context (cache-aware streaming) encoders are not supported")
    if enc.get("causal_downsampling", False) or enc.get("reduction") or enc.get("conv_context_size") not in (None, "None"):
        raise UnsupportedCheckpointError(f"{path}: causal or reduced FastConformer variants are not supported")
    feat_out = enc.get("feat_out", -1)
    if feat_out not in (-1, None) and int(feat_out) > 0:
        raise UnsupportedCheckpointError(f"{path}: encoder output projection (feat_out={feat_out}) is not supported")
    factor = int(enc.get("subsampling_factor", 4))
    if factor < 2 or factor & (factor - 1):
        raise UnsupportedCheckpointError(f"{path}: subsampling_factor {factor} is not a power of 2")
    d_model = int(_need(enc, "d_model", "encoder"))
    channels = enc.get("subsampling_conv_channels", -1)
    enc_cfg = EncoderConfig(
        feat_in=int(_need(enc, "feat_in", "encoder")),
        n_layers=int(_need(enc, "n_layers", "encoder")),
        d_model=d_model,
        n_heads=int(enc.get("n_heads", 4)),
        ff_expansion_factor=int(enc.get("ff_expansion_factor", 4)),
        subsampling_factor=factor,
        subsampling_conv_channels=d_model if channels in (-1, None) else int(channels),
        conv_kernel_size=int(enc.get("conv_kernel_size", 31)),
        xscaling=bool(enc.get("xscaling", True)),
        untie_biases=bool(enc.get("untie_biases", True)),
        use_bias=bool(enc.get("use_bias", True)),
    )
    if enc_cfg.feat_in != pre_cfg.features:
        raise UnsupportedCheckpointError(
            f"{path}: encoder feat_in {enc_cfg.feat_in} does not match the preprocessor's {pre_cfg.features} features"
        )

    dec = cfg["decoder"]
    if _target(dec) != "RNNTDecoder":
        raise UnsupportedCheckpointError(
            f"{path}: unsupported prediction network {_target(dec)!r}; only the LSTM RNNTDecoder is supported"
        )
    prednet = _need(dec, "prednet", "decoder")
    if not dec.get("blank_as_pad", True):
        raise UnsupportedCheckpointError(f"{path}: decoders with blank_as_pad=false are not supported")
    if dec.get("normalization_mode") not in (None, "None"):
        raise UnsupportedCheckpointError(f"{path}: prediction-network normalization {dec.get('normalization_mode')!r} is not supported")
    pred_hidden = int(_need(prednet, "pred_hidden", "decoder.prednet"))
    rnn_hidden = int(prednet.get("rnn_hidden_size", -1) or -1)
    if rnn_hidden > 0 and rnn_hidden != pred_hidden:
        raise UnsupportedCheckpointError(f"{path}: LSTM with projection (rnn_hidden_size != pred_hidden) is not supported")

    joint = cfg["joint"]
    if _target(joint) != "RNNTJoint":
        raise UnsupportedCheckpointError(f"{path}: unsupported joint {_target(joint)!r}; only RNNTJoint is supported")
    jointnet = _need(joint, "jointnet", "joint")
    activation = str(jointnet.get("activation", "relu")).lower()
    if activation not in ("relu", "tanh", "sigmoid"):
        raise UnsupportedCheckpointError(f"{path}: unsupported joint activation {activation!r}")
    vocab = dec.get("vocab_size", joint.get("num_classes"))
    if vocab is None:
        raise UnsupportedCheckpointError(f"{path}: model_config.yaml gives no vocabulary size (decoder.vocab_size)")

    decoding = cfg.get("decoding") or {}
    loss = cfg.get("loss") or {}
    model_type = decoding.get("model_type", "rnnt")
    extra = int(joint.get("num_extra_outputs", 0) or 0)
    durations: List[int] = []
    if model_type == "tdt" or loss.get("loss_name") == "tdt" or extra:
        durations = (
            decoding.get("durations")
            or (loss.get("tdt_kwargs") or {}).get("durations")
            or (cfg.get("model_defaults") or {}).get("tdt_durations")
            or []
        )
        durations = [int(d) for d in durations]
        if not durations or extra != len(durations):
            raise UnsupportedCheckpointError(
                f"{path}: TDT model without a matching durations list (joint has {extra} extra outputs, "
                f"durations {durations}); multi-blank models are not supported"
            )
    if model_type not in ("rnnt", "tdt"):
        raise UnsupportedCheckpointError(f"{path}: unsupported transducer type {model_type!r}")
    greedy = decoding.get("greedy") or {}
    max_symbols = greedy.get("max_symbols", greedy.get("max_symbols_per_step", 10)) or 10
    return TransducerConfig(
        preprocessor=pre_cfg,
        encoder=enc_cfg,
        vocab_size=int(vocab),
        pred_hidden=pred_hidden,
        pred_layers=int(prednet.get("pred_rnn_layers", 1)),
        joint_hidden=int(_need(jointnet, "joint_hidden", "joint.jointnet")),
        joint_activation=activation,
        durations=durations,
        max_symbols=int(max_symbols),
    )


def _tokenizer(cfg: Dict[str, Any], files: Dict[str, bytes], path: str) -> SentencePieceDecoder:
    tok = cfg.get("tokenizer")
    if not isinstance(tok, dict):
        labels = (cfg.get("decoder") or {}).get("vocabulary") or cfg.get("labels")
        if labels:
            raise UnsupportedCheckpointError(
                f"{path}: character-vocabulary models are not supported; a SentencePiece (bpe) tokenizer is required"
            )
        raise UnsupportedCheckpointError(f"{path}: model_config.yaml has no tokenizer section")
    kind = str(tok.get("type", "bpe")).lower()
    if kind != "bpe":
        raise UnsupportedCheckpointError(
            f"{path}: unsupported tokenizer type {kind!r}; only SentencePiece ('bpe') tokenizers are supported"
        )
    if tok.get("langs") or tok.get("type") == "agg":
        raise UnsupportedCheckpointError(f"{path}: aggregate (multi-language) tokenizers are not supported")
    model_path = str(tok.get("model_path") or "tokenizer.model")
    name = model_path[5:] if model_path.startswith("nemo:") else os.path.basename(model_path)
    key = _find(files, name) or _find(files, "tokenizer.model")
    if key is None:
        raise ModelLoadError(
            f"{path}: the SentencePiece tokenizer model ({name}) is missing from the .nemo archive"
        )
    return SentencePieceDecoder.from_bytes(files[key], name)


def load_nemo(path: str | os.PathLike) -> NemoCheckpoint:
    """Read a ``.nemo`` archive: config, weights (on the CPU) and tokenizer."""
    path = os.fspath(path)
    files = _read_archive(path)
    config_key = _find(files, CONFIG_NAME)
    if config_key is None:
        raise ModelLoadError(f"{path}: {CONFIG_NAME} is missing from the .nemo archive")
    weights_key = _find(files, WEIGHTS_NAME)
    if weights_key is None:
        raise ModelLoadError(f"{path}: {WEIGHTS_NAME} is missing from the .nemo archive")
    try:
        raw = _yaml().safe_load(files[config_key].decode("utf-8"))
    except Exception as exc:  # yaml.YAMLError, UnicodeDecodeError
        raise ModelLoadError(f"{path}: {CONFIG_NAME} is not valid YAML: {str(exc).splitlines()[0]}") from None
    config = parse_config(raw, path)
    tokenizer = _tokenizer(raw, files, path)
    if tokenizer.vocab_size != config.vocab_size:
        raise UnsupportedCheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} pieces but the model has {config.vocab_size} labels"
        )
    try:
        state = torch.load(io.BytesIO(files[weights_key]), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"{path}: {WEIGHTS_NAME} is not a readable torch state dict: {str(exc).splitlines()[0]}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{path}: {WEIGHTS_NAME} does not hold a state dict of tensors")
    return NemoCheckpoint(path, config, state, tokenizer, raw)
