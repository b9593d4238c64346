"""A decoder-only checkpoint's config.json, read into the one description the model code needs.

Six Hugging Face layouts share it: Llama, Qwen3, Qwen3-MoE, Qwen3-Next and Qwen3.5 (dense and
MoE). Qwen3.5 checkpoints as released are vision-language models: their text config is nested
under ``text_config`` and their weights under ``model.language_model.``; the vision tower is left
out (the loader says so once).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ...errors import ModelLoadError, UnsupportedCheckpointError

# architecture name in config.json -> (family kind, whether the weights sit under model.language_model.)
ARCHITECTURES: Dict[str, Tuple[str, bool]] = {
    "LlamaForCausalLM": ("llama", False),
    "Qwen3ForCausalLM": ("qwen3", False),
    "Qwen3MoeForCausalLM": ("qwen3_moe", False),
    "Qwen3NextForCausalLM": ("qwen3_next", False),
    "Qwen3_5ForCausalLM": ("qwen3_5", False),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", False),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", True),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", True),
}
HYBRID_KINDS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@dataclass
class LLMConfig:
    kind: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: Optional[dict] = None
    layer_types: List[str] = field(default_factory=list)  # "full_attention" | "linear_attention"
    # Gated DeltaNet
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 4
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: List[bool] = field(default_factory=list)
    eos_token_ids: Tuple[int, ...] = ()
    bos_token_id: Optional[int] = None
    nested: bool = False  # weights under model.language_model. (Qwen3.5 as released)
    has_vision: bool = False

    @property
    def hybrid(self) -> bool:
        return self.kind in HYBRID_KINDS

    @property
    def qk_norm(self) -> bool:
        return self.kind != "llama"

    @property
    def zero_centered_norm(self) -> bool:
        """Qwen3-Next and Qwen3.5 store RMSNorm weights as an offset from one."""
        return self.hybrid

    @property
    def gated_attention(self) -> bool:
        return self.hybrid

    @property
    def shared_expert(self) -> bool:
        return self.num_experts > 0 and self.shared_expert_intermediate_size > 0

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]


def _ints(value) -> Tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope(text: dict) -> Tuple[float, Optional[float], Optional[dict]]:
    """(theta, partial rotary factor or None, llama3-style scaling or None) from either config spelling."""
    params = text.get("rope_parameters") or {}
    scaling = text.get("rope_scaling") or None
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor"))
    rope_type = params.get("rope_type") or (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if rope_type == "default":
        return float(theta), partial, None
    if rope_type == "llama3":
        source = scaling if scaling and (scaling.get("rope_type") or scaling.get("type")) == "llama3" else params
        return float(theta), partial, dict(source)
    raise UnsupportedCheckpointError(f"rope type {rope_type!r} is not supported (default and llama3 are)")


def parse_config(raw: dict, where: str = "config.json") -> LLMConfig:
    """An ``LLMConfig`` from a parsed config.json; ``UnsupportedCheckpointError`` names what is wrong."""
    architectures = raw.get("architectures") or []
    arch = next((a for a in architectures if a in ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(architectures) or f"none (model_type {raw.get('model_type')!r})"
        raise UnsupportedCheckpointError(
            f"{where}: architecture {named} is not supported; ostinato loads {', '.join(sorted(ARCHITECTURES))}")
    kind, nested = ARCHITECTURES[arch]
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    nested = nested or text is not raw
    try:
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        layers = int(text["num_hidden_layers"])
        head_dim = int(text.get("head_dim") or hidden // heads)
        theta, partial, scaling = _rope(text)
        config = LLMConfig(
            kind=kind,
            architecture=arch,
            vocab_size=int(text["vocab_size"]),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(text.get("intermediate_size") or 0),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            # the hybrids rotate a quarter of each head unless told otherwise
            rotary_dim=int(head_dim * (partial if partial is not None else 0.25 if kind in HYBRID_KINDS else 1.0)),
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            attention_bias=bool(text.get("attention_bias", False)),
            mlp_bias=bool(text.get("mlp_bias", False)),
            rope_scaling=scaling,
            nested=nested,
            has_vision="vision_config" in raw,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedCheckpointError(f"{where}: cannot read the text model's config ({exc})") from None
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedCheckpointError(f"{where}: activation {act!r} is not supported (silu is)")
    if kind in HYBRID_KINDS:
        types = text.get("layer_types")
        if types is None:
            interval = int(text.get("full_attention_interval", 4))
            types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
        config.layer_types = list(types)
        config.linear_num_key_heads = int(text.get("linear_num_key_heads", 16))
        config.linear_num_value_heads = int(text.get("linear_num_value_heads", 32))
        config.linear_key_head_dim = int(text.get("linear_key_head_dim", 128))
        config.linear_value_head_dim = int(text.get("linear_value_head_dim", 128))
        config.linear_conv_kernel = int(text.get("linear_conv_kernel_dim", 4))
    else:
        config.layer_types = ["full_attention"] * layers
    if kind in ("qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        config.num_experts = int(text.get("num_experts", text.get("num_local_experts", 0)))
        config.experts_per_token = int(text.get("num_experts_per_tok", 0))
        config.moe_intermediate_size = int(text.get("moe_intermediate_size", 0))
        config.shared_expert_intermediate_size = int(text.get("shared_expert_intermediate_size", 0)) \
            if kind != "qwen3_moe" else 0
        config.norm_topk_prob = True if kind == "qwen3_5_moe" else bool(text.get("norm_topk_prob", True))
        if kind == "qwen3_5_moe":
            config.moe_layers = [config.num_experts > 0] * layers
        else:
            step = int(text.get("decoder_sparse_step", 1))
            only = set(text.get("mlp_only_layers") or [])
            config.moe_layers = [i not in only and config.num_experts > 0 and (i + 1) % step == 0
                                 for i in range(layers)]
    bad = [t for t in config.layer_types if t not in ("full_attention", "linear_attention")]
    if bad or len(config.layer_types) != layers:
        raise UnsupportedCheckpointError(f"{where}: layer_types must name full_attention or linear_attention "
                                         f"for each of the {layers} layers")
    config.eos_token_ids = _ints(text.get("eos_token_id", raw.get("eos_token_id")))
    bos = text.get("bos_token_id", raw.get("bos_token_id"))
    config.bos_token_id = int(bos) if isinstance(bos, int) else None
    if config.rotary_dim % 2 or config.rotary_dim > head_dim:
        raise UnsupportedCheckpointError(f"{where}: rotary dimension {config.rotary_dim} does not fit head_dim {head_dim}")
    return config


def read_config(folder: str) -> LLMConfig:
    """Read ``folder``/config.json (and generation_config.json's end-of-sequence ids, which win)."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{folder}: no config.json (expected a Hugging Face model folder)") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot be read as JSON ({exc})") from None
    config = parse_config(raw, path)
    generation = os.path.join(folder, "generation_config.json")
    if os.path.exists(generation):
        try:
            with open(generation, encoding="utf-8") as f:
                gen = json.load(f)
        except (OSError, ValueError):
            gen = {}
        eos = _ints(gen.get("eos_token_id"))
        if eos:
            config.eos_token_ids = eos
    return config


def rope_inverse_frequencies(config: LLMConfig):
    """The rotary inverse frequencies (float32), with Llama 3's long-context scaling when configured."""
    import torch

    dim = config.rotary_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)
