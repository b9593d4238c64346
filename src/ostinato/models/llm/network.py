"""The decoder-only network: embedding, the layers, the final norm and the output projection, with
a prefill entry (chunks of prompt tokens for some rows) and a decode entry (one token for each of
the first B rows) over the same weights and the same state buffers."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor, nn

from .config import LLMConfig, rope_inverse_frequencies
from ...ops import skinny
from .layers import (
    DecoderLayer, Normed, RMSNorm, StepPlaces, grouped_mm_available, project_normed, rotary_tables,
)


class _Body(nn.Module):
    def __init__(self, config: LLMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)


class DecoderNet(nn.Module):
    def __init__(self, config: LLMConfig):
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # float32 whatever the weights' dtype, so kept out of the module's buffers; computed on the
        # CPU even while the module itself is built on the meta device
        with torch.device("cpu"):
            self.inv_freq = rope_inverse_frequencies(config)

    def placed(self) -> "DecoderNet":
        """Call after the weights moved: puts the rotary table beside them and picks the MoE kernels."""
        weight = self.model.embed_tokens.weight
        self.inv_freq = self.inv_freq.to(weight.device)
        grouped = grouped_mm_available(weight.device, weight.dtype)
        for layer in self.model.layers if not getattr(self, "_fused", False) else ():
            (layer.linear_attn if layer.linear else layer.self_attn).fuse()
            if layer.moe:
                layer.mlp.grouped = grouped
            layer.mlp.fuse()
        self._fused = True
        return self

    # -- state ---------------------------------------------------------------------------------
    def state_spec(self, rows: int, capacity: int) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
        """The buffers decoding needs for ``rows`` rows of up to ``capacity`` tokens each."""
        c, dtype = self.config, self.model.embed_tokens.weight.dtype
        spec = {}
        for i, layer in enumerate(self.model.layers):
            if layer.linear:
                la = layer.linear_attn
                spec[f"conv{i}"] = ((rows, la.conv_dim, la.kernel - 1), dtype)
                spec[f"rec{i}"] = ((rows, la.v_heads, la.dk, la.dv), torch.float32)
            else:
                spec[f"k{i}"] = ((rows, c.num_kv_heads, capacity, c.head_dim), dtype)
                spec[f"v{i}"] = ((rows, c.num_kv_heads, capacity, c.head_dim), dtype)
        return spec

    def reset_rows(self, state, rows: Tensor) -> None:
        """Zero the recurrent state of ``rows`` before a new prompt (the KV cache needs no reset: a row
        only ever reads positions it wrote)."""
        for i, layer in enumerate(self.model.layers):
            if layer.linear:
                state[f"conv{i}"].index_fill_(0, rows, 0)
                state[f"rec{i}"].index_fill_(0, rows, 0)

    # -- running -------------------------------------------------------------------------------
    def prefill(self, tokens: Tensor, rows: Tensor, start: int, state) -> Tensor:
        """Tokens [G, T] at positions start..start+T-1 of rows ``rows``: writes their state and returns the
        normed hidden state of every token [G, T, H]."""
        x = self.model.embed_tokens(tokens)
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        cos, sin = rotary_tables(positions, self.inv_freq, x.dtype)
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            if layer.linear:
                h = layer.linear_attn.prefill(h, state[f"conv{i}"], state[f"rec{i}"], rows)
            else:
                h = layer.self_attn.prefill(h, cos, sin, state[f"k{i}"], state[f"v{i}"], rows, start)
            x = layer._mlp(x, h)
        return self.model.norm(x)

    def decode(self, tokens: Tensor, positions: Tensor, state, rows: int) -> Tensor:
        """One token for each of the first ``rows`` rows at ``positions``: float32 logits [rows, V].
        Graph-safe: fixed shapes, no host sync. Where the skinny products run, each carries the
        residual stream's square sums to the next, which applies its RMSNorm on load."""
        x = self.model.embed_tokens(tokens)
        square_sums = x.float().pow(2).sum(-1, keepdim=True) if skinny.op_can_run(x, self.lm_head.weight) else None
        places = self._places(positions, state, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x, square_sums = layer.decode(x, square_sums, places, state, i, rows)
        return project_normed(Normed(x, square_sums, self.model.norm), self.lm_head.weight).float()

    def _places(self, positions: Tensor, state, dtype: torch.dtype) -> StepPlaces:
        cos, sin = rotary_tables(positions, self.inv_freq, dtype)
        visible = None
        for i, layer in enumerate(self.model.layers):
            if not layer.linear:  # every attention layer's cache has the same length
                span = torch.arange(state[f"k{i}"].shape[2], device=positions.device)
                visible = span[None, :] <= positions[:, None]
                break
        return StepPlaces(positions, positions + 1, cos, sin, self.inv_freq, visible)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()
