"""Weights of a Hugging Face decoder-only folder (safetensors, one file or shards) into a DecoderNet.

Each tensor is read once, straight onto the target device in the target dtype, and becomes the
parameter: no second copy. Layouts differ only in names and packing, mapped here:

* Qwen3.5 as released keeps the text model under ``model.language_model.``; the vision tower
  (``model.visual.``) and the multi-token-prediction head (``mtp.``) are not loaded;
* MoE experts come one module per expert (``experts.N.gate_proj`` ...) or stacked
  (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); both become the stacks;
* Qwen3-Next packs q, k, v, z (and b, a) per key head in one projection; it is unpacked into
  Qwen3.5's separate projections so one Gated DeltaNet serves both.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor, nn

from ...errors import ModelLoadError, UnsupportedCheckpointError
from .config import LLMConfig
from .network import DecoderNet

log = logging.getLogger(__name__)

_IGNORED = (re.compile(r"^model\.visual\."), re.compile(r"^mtp\."), re.compile(r"\.rotary_emb\.inv_freq$"))
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def weight_files(folder: str) -> List[str]:
    """The safetensors files of ``folder``: the index's shards (each must exist) or model.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: cannot be read ({exc})") from None
        missing = [s for s in shards if not os.path.exists(os.path.join(folder, s))]
        if missing:
            raise ModelLoadError(f"{folder}: weight shard {missing[0]} is missing "
                                 f"({len(missing)} of {len(shards)} shards named in model.safetensors.index.json)")
        return [os.path.join(folder, s) for s in shards]
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise ModelLoadError(f"{folder}: no weights (model.safetensors or model.safetensors.index.json)")


def _canonical(name: str, config: LLMConfig) -> str:
    if config.nested and name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


class _Reader:
    """Tensors by canonical name, opened lazily from their shards onto the device."""

    def __init__(self, files: List[str], config: LLMConfig, device: torch.device):
        from safetensors import safe_open

        self.handles, self.where = [], {}
        self.skipped_vision = False
        target = str(device) if device.type != "cuda" or device.index is not None else "cuda:0"
        for path in files:
            try:
                handle = safe_open(path, framework="pt", device=target)
            except Exception as exc:  # noqa: BLE001 - a corrupt or truncated file: say which
                raise ModelLoadError(f"{path}: cannot be read as safetensors ({exc})") from None
            self.handles.append(handle)
            for name in handle.keys():
                if any(p.search(name) for p in _IGNORED):
                    self.skipped_vision |= name.startswith("model.visual.")
                    continue
                self.where[_canonical(name, config)] = (handle, name)

    def names(self):
        return self.where.keys()

    def get(self, name: str) -> Tensor:
        handle, stored = self.where[name]
        return handle.get_tensor(stored)


def _qwen3_next_unpack(config: LLMConfig, qkvz: Tensor, ba: Tensor) -> Dict[str, Tensor]:
    """Qwen3-Next's per-key-head packing [q k v z] and [b a] -> Qwen3.5's four projections."""
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, hv // hk
    hidden = qkvz.shape[-1]
    q, k, v, z = qkvz.view(hk, 2 * dk + 2 * r * dv, hidden).split([dk, dk, r * dv, r * dv], dim=1)
    b, a = ba.view(hk, 2 * r, hidden).split([r, r], dim=1)
    flat = lambda t: t.reshape(-1, hidden)  # noqa: E731
    return {"in_proj_qkv.weight": torch.cat([flat(q), flat(k), flat(v)]), "in_proj_z.weight": flat(z),
            "in_proj_b.weight": flat(b), "in_proj_a.weight": flat(a)}


def load_weights(net: DecoderNet, folder: str, device: torch.device, dtype: torch.dtype) -> None:
    """Fill ``net`` (built on the meta device) with the folder's weights on ``device`` in ``dtype``."""
    config = net.config
    reader = _Reader(weight_files(folder), config, device)
    if reader.skipped_vision:
        log.info("%s: the vision tower is not loaded (ostinato decodes text only)", folder)
    tensors: Dict[str, Callable[[], Tensor]] = {name: (lambda n=name: reader.get(n)) for name in reader.names()}
    _stack_experts(tensors, config)
    _unpack_linear_attention(tensors, config)
    wanted = dict(net.named_parameters(remove_duplicate=False))
    tied = config.tie_word_embeddings
    if tied:
        wanted.pop("lm_head.weight", None)
        tensors.pop("lm_head.weight", None)
    missing = [n for n in wanted if n not in tensors]
    if missing:
        raise UnsupportedCheckpointError(
            f"{folder}: {len(missing)} weights are missing for {config.architecture}, e.g. {missing[0]}")
    unexpected = [n for n in tensors if n not in wanted]
    if unexpected:
        raise UnsupportedCheckpointError(
            f"{folder}: {len(unexpected)} weights are not part of {config.architecture}, e.g. {unexpected[0]}")
    modules = dict(net.named_modules())
    for name, param in wanted.items():
        value = tensors[name]()
        if name.endswith("conv1d.weight") and value.dim() == 2:
            value = value[:, None, :]
        if tuple(value.shape) != tuple(param.shape):
            raise UnsupportedCheckpointError(
                f"{folder}: {name} has shape {tuple(value.shape)}, the config implies {tuple(param.shape)}")
        owner, _, leaf = name.rpartition(".")
        modules[owner]._parameters[leaf] = nn.Parameter(value.to(device=device, dtype=dtype), requires_grad=False)
    if tied:
        net.lm_head.weight = net.model.embed_tokens.weight


def _stack_experts(tensors: Dict[str, Callable[[], Tensor]], config: LLMConfig) -> None:
    """experts.N.{gate,up,down}_proj or experts.{gate_up,down}_proj -> mlp.experts_gate_up / experts_down."""
    per_expert: Dict[str, Dict[Tuple[int, str], str]] = defaultdict(dict)
    for name in list(tensors):
        match = _EXPERT.match(name)
        if match:
            per_expert[match.group(1)][(int(match.group(2)), match.group(3))] = name
        elif name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name[: -len(".experts.gate_up_proj")]
            load = tensors.pop(name)
            tensors[prefix + ".experts_gate_up"] = lambda f=load: _expert_major(f(), config.hidden_size, last=True)
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name[: -len(".experts.down_proj")]
            load = tensors.pop(name)
            tensors[prefix + ".experts_down"] = lambda f=load: _expert_major(f(), config.hidden_size, last=False)
    for prefix, parts in per_expert.items():
        count = config.num_experts
        names = {key: tensors.pop(name) for key, name in parts.items()}
        if len(names) != 3 * count:
            raise UnsupportedCheckpointError(f"{prefix}: {len(names) // 3} of {count} experts have weights")

        def gate_up(names=names, count=count):
            return torch.stack([torch.cat([names[(e, "gate_proj")](), names[(e, "up_proj")]()]) for e in range(count)])

        def down(names=names, count=count):
            return torch.stack([names[(e, "down_proj")]() for e in range(count)])

        tensors[prefix + ".experts_gate_up"] = gate_up
        tensors[prefix + ".experts_down"] = down


def _expert_major(value: Tensor, hidden: int, last: bool) -> Tensor:
    """Stacked experts as [E, out, in]; some exports store [E, in, out]."""
    if last and value.shape[-1] != hidden and value.shape[-2] == hidden:
        return value.transpose(-1, -2).contiguous()
    if not last and value.shape[-2] != hidden and value.shape[-1] == hidden:
        return value.transpose(-1, -2).contiguous()
    return value


def _unpack_linear_attention(tensors: Dict[str, Callable[[], Tensor]], config: LLMConfig) -> None:
    for name in [n for n in tensors if n.endswith(".linear_attn.in_proj_qkvz.weight")]:
        prefix = name[: -len("in_proj_qkvz.weight")]
        qkvz, ba = tensors.pop(name), tensors.pop(prefix + "in_proj_ba.weight")
        cache: Dict[str, Tensor] = {}

        def part(key, qkvz=qkvz, ba=ba, cache=cache):
            if not cache:
                cache.update(_qwen3_next_unpack(config, qkvz(), ba()))
            return cache.pop(key)

        for key in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"):
            tensors[prefix + key] = lambda key=key, part=part: part(key)
