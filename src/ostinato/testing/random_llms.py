"""Language-model shapes with random weights, built straight on the device (benchmarks, GPU tests).

The configs are the released models' text shapes, written as config.json would give them; weights
are drawn on the device in the target dtype, so a 70 GB model never exists twice.
"""
from __future__ import annotations

import math

import torch

from ..models.llm.config import parse_config
from ..models.llm.network import DecoderNet

SHAPES = {
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
    },
    "qwen3.5-2b": {
        "architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
        "vocab_size": 248320, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                                  "partial_rotary_factor": 0.25},
        "max_position_embeddings": 262144, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    },
    "qwen3.5-35b-a3b": {
        "architectures": ["Qwen3_5MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 40,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
        "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "vocab_size": 248320,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
    },
}


@torch.no_grad()
def random_network(raw_config: dict, device, dtype, seed: int = 0) -> DecoderNet:
    """A DecoderNet of ``raw_config``'s shape with random weights made on ``device`` in ``dtype``
    (no end-of-sequence token, so every row runs to its token limit)."""
    config = parse_config(raw_config, "random config")
    config.eos_token_ids = ()
    with torch.device("meta"):
        net = DecoderNet(config).to(dtype)  # allocated once in its final dtype: 35B-A3B is 70 GB in bf16
    net.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in net.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(0.0 if config.zero_centered_norm and "linear_attn.norm" not in name else 1.0)
        elif name.endswith("A_log"):
            p.uniform_(0.0, math.log(16.0), generator=g)
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        else:
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.normal_(0.0, fan_in ** -0.5, generator=g)
    if config.tie_word_embeddings:
        net.lm_head.weight = net.model.embed_tokens.weight
    net.eval().requires_grad_(False)
    return net.placed()
