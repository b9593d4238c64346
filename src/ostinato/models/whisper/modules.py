"""Whisper's encoder and decoder as plain PyTorch, with parameter names as in OpenAI's checkpoints.

The decoder works on caller-owned buffers: self-attention K/V caches of a fixed length (the
model's text context) written in place at each row's position, and cross-attention K/V projected
once per window. Shapes never depend on how many tokens have been decoded, so the same code runs
eagerly or inside a captured graph. This module knows nothing of graphs or decoding rules.

A one-token step in half precision on CUDA (with Triton) runs through fused operators
(``ostinato.ops``): linear layers with bias, GELU and the residual add in one kernel, and
attention of one query over each row's filled cache positions only (split over the sequence).
A step is a chain of small, latency-bound kernels, so the small products (and the cross-attention)
ask L2 for their weights (keys) while the kernel ahead still runs (``prefetch`` under PDL,
``PREFETCH_MAX_BYTES``): tiny.en's step 7% faster at one row on an H100, large-v3's 2%.
Float32 and the CPU keep plain PyTorch, so float32 results are the same on every device.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ops import LazyModule, cpu_linear
from ...ops.attention import attention
from ...ops.triton_support import kernels_can_run
from .config import WhisperDims

# The Triton kernels, imported (Triton with them) at their first use or by the load's helper thread
KERNEL_MODULES = ("ostinato.ops.decode_attention", "ostinato.ops.skinny", "ostinato.ops.slot_write",
                  "ostinato.ops.embedding")
attention_ops, skinny, slot_write, embedding_ops = (LazyModule(name) for name in KERNEL_MODULES)


# The fused step's products whose weights are at most this size ask L2 for them while the kernel
# ahead runs; larger ones are bandwidth-bound, and their early requests only crowd the running
# kernel's. Step per row on an H100 (ms, none / all / up to 4 MiB, each with the cross-attention's
# K/V prefetched too): tiny.en 1 row 0.232 / 0.217 / 0.216, 16 rows 0.316 / 0.305 / 0.303; large-v3
# 1 row 2.072 / 2.094 / 2.024, 16 rows 3.688 / 3.710 / 3.625 (its 1280 x 1280 products in, q/k/v
# and the feed-forward's out). Language models' bigger products were 6-15% slower with it.
PREFETCH_MAX_BYTES = 4 << 20


def _prefetch(weight: Tensor) -> bool:
    """Whether a fused step's product with ``weight`` prefetches it (``PREFETCH_MAX_BYTES``)."""
    return weight.numel() * weight.element_size() <= PREFETCH_MAX_BYTES


def fused_step_supported(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether one-token decode steps on ``device`` in ``dtype`` run through the fused operators."""
    return kernels_can_run(device, dtype) and head_dim in attention_ops.HEAD_DIMS


def fused_step_enabled(x: Tensor, head_dim: int) -> bool:
    """Whether a one-token decode step on ``x`` (its activations, or its weights: their device and
    dtype) runs through the fused half-precision operators."""
    return fused_step_supported(x.device, x.dtype, head_dim)


def _on_meta() -> bool:
    """Whether modules are being built on the meta device (``from_state_dict``: the checkpoint brings
    the values). There, computed or random initial values are skipped: their meta kernels are
    Python decompositions whose first use imports torch._dynamo, ~3 s of every model load."""
    return torch.get_default_device().type == "meta"


def _linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)``; a few rows on the CPU in MKL's fast orientation. A decode step reads every weight
    from memory (the vocabulary product has evicted them from the cache): with q/k/v packed, this
    took a tiny.en step on two EPYC cores from 7.5 to 5.6 ms at one row and 11.7 to 9.9 ms at five."""
    return cpu_linear.linear(x, layer.weight, layer.bias)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """Whisper's fixed sinusoidal position table for the encoder."""
    assert channels % 2 == 0
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled_time = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        return x.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)

    def pack_qkv(self, in_major: bool = False) -> None:
        """Hold the query, key and value weights in one [3d, d] tensor and their biases in one [3d]
        tensor, the parameters being views of them (still one copy of each weight), so a fused step
        projects all three in one kernel. The key has no bias: the middle third of the packed bias
        is zeros, the only bytes packing adds. ``in_major``: the packed weight is stored [d, 3d]
        (see ``cpu_linear``), also where it was packed before. Idempotent."""
        weight, d = getattr(self, "qkv_weight", None), self.query.weight.shape[0]
        if weight is None:
            with torch.no_grad():
                weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
                bias = torch.cat([self.query.bias, torch.zeros_like(self.query.bias), self.value.bias])
            self.query.bias = nn.Parameter(bias[:d], requires_grad=False)
            self.value.bias = nn.Parameter(bias[2 * d :], requires_grad=False)
            self.qkv_bias = bias
        elif not in_major or cpu_linear.is_in_major(weight):
            return
        if in_major:
            weight = cpu_linear.in_major_copy(weight.detach())
        for i, linear in enumerate((self.query, self.key, self.value)):
            linear.weight = nn.Parameter(weight[i * d : (i + 1) * d], requires_grad=False)
        self.qkv_weight = weight

    def project_kv(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        return self.split_heads(self.key(x)), self.split_heads(self.value(x))

    def project_qkv(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The query [B, T, d] and the keys and values split into heads: one product where the
        weights are packed. A few rows on the CPU go through ``cpu_linear`` (MKL's fast orientation)."""
        if getattr(self, "qkv_weight", None) is not None:
            q, k, v = cpu_linear.linear(x, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)
        else:
            q, k, v = (_linear(layer, x) for layer in (self.query, self.key, self.value))
        return q, self.split_heads(k), self.split_heads(v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, group: int = 1) -> Tensor:
        """Attention of ``q`` [B, T, d] over ``k``/``v`` [B / group, H, S, D]: ``group`` > 1, consecutive
        rows in groups of that size share one row of keys and values (a window's beams)."""
        q = self.split_heads(q)
        if group == 1:
            out = attention(q, k, v, attn_mask=mask)
        else:
            b, h, t, d = q.shape
            q = q.view(b // group, group, h, t, d).transpose(1, 2).reshape(b // group, h, group * t, d)
            out = attention(q, k, v, attn_mask=mask)
            out = out.view(b // group, h, group, t, d).transpose(1, 2).reshape(b, h, t, d)
        return _linear(self.out, self.merge_heads(out))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = nn.LayerNorm(n_state) if cross_attention else None
        n_mlp = n_state * 4
        self.mlp = nn.Sequential(nn.Linear(n_state, n_mlp), nn.GELU(), nn.Linear(n_mlp, n_state))
        self.mlp_ln = nn.LayerNorm(n_state)

    def encode(self, x: Tensor) -> Tensor:
        h = self.attn_ln(x)
        k, v = self.attn.project_kv(h)
        x = x + self.attn.attend(self.attn.query(h), k, v)
        return x + self.mlp(self.mlp_ln(x))

    def decode(
        self,
        x: Tensor,
        self_k: Tensor,
        self_v: Tensor,
        write_index: Tensor,
        self_mask: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_group: int = 1,
        keys: Optional[int] = None,
    ) -> Tensor:
        """``keys``: attend to the first ``keys`` cache positions only (the rest are masked for every
        live row). The write goes to the whole cache: a free row may hold any position."""
        q, k, v = self.attn.project_qkv(self.attn_ln(x))
        # Write this step's keys/values at each row's positions; the cache never changes address.
        self_k.scatter_(2, write_index, k)
        self_v.scatter_(2, write_index, v)
        if keys is not None:
            self_k, self_v = self_k[:, :, :keys], self_v[:, :, :keys]
        x = x + self.attn.attend(q, self_k, self_v, self_mask)
        h = self.cross_attn_ln(x)
        x = x + self.cross_attn.attend(_linear(self.cross_attn.query, h), cross_k, cross_v, group=cross_group)
        fc1, gelu, fc2 = self.mlp
        return x + _linear(fc2, gelu(_linear(fc1, self.mlp_ln(x))))

    def decode_fused(
        self, x: Tensor, self_k: Tensor, self_v: Tensor, lengths: Tensor, cross_k: Tensor, cross_v: Tensor,
        cross_group: int = 1, cross_rows: Optional[Tensor] = None, self_rows: Optional[Tensor] = None,
        write_index: Optional[Tensor] = None,
    ) -> Tensor:
        """``decode`` for one token per row ([B, d]) through the fused operators; ``cross_group`` as in
        ``attend`` (a window's beams read its cross K/V once); ``cross_rows``: the cross K/V row of
        each group, read on the device (None: group g reads row g).

        Several tokens of each cache row (a prompt's prefill): the rows of ``x`` are the tokens,
        ``self_rows`` [B] the cache row each reads and ``write_index`` (as ``decode``'s) where their
        keys and values go; all are written first, then each token attends to the keys up to its
        own position (``lengths - 1``)."""
        b, d = x.shape
        attn, cross, heads = self.attn, self.cross_attn, self.attn.n_head
        h = skinny.add_layer_norm(x, None, self.attn_ln.weight, self.attn_ln.bias, self.attn_ln.eps)[1]
        if getattr(attn, "qkv_weight", None) is not None:
            qkv = skinny.linear(h, attn.qkv_weight, attn.qkv_bias, prefetch=_prefetch(attn.qkv_weight))
            q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
        else:
            q = skinny.linear(h, attn.query.weight, attn.query.bias)
            k = skinny.linear(h, attn.key.weight)
            v = skinny.linear(h, attn.value.weight, attn.value.bias)
        if write_index is not None:
            rows, _, tokens, _ = write_index.shape
            self_k.scatter_(2, write_index, k.view(rows, tokens, heads, -1).transpose(1, 2))
            self_v.scatter_(2, write_index, v.view(rows, tokens, heads, -1).transpose(1, 2))
            a = attention_ops.decode_attention(q.view(b, heads, -1), self_k, self_v, lengths, kv_rows=self_rows)
        else:
            # The kernel writes this step's key/value into the cache at lengths - 1 (the row's position).
            a = attention_ops.decode_attention(q.view(b, heads, -1), self_k, self_v, lengths,
                                               new_k=k.view(b, heads, -1), new_v=v.view(b, heads, -1))
        x = skinny.linear(a.reshape(b, d), attn.out.weight, attn.out.bias, residual=x,
                          prefetch=_prefetch(attn.out.weight))
        h = skinny.add_layer_norm(x, None, self.cross_attn_ln.weight, self.cross_attn_ln.bias, self.cross_attn_ln.eps)[1]
        q = skinny.linear(h, cross.query.weight, cross.query.bias, prefetch=_prefetch(cross.query.weight))
        a = attention_ops.decode_attention(q.view(b, heads, -1), cross_k, cross_v, group=cross_group,
                                           kv_rows=cross_rows, prefetch=True)
        x = skinny.linear(a.reshape(b, d), cross.out.weight, cross.out.bias, residual=x,
                          prefetch=_prefetch(cross.out.weight))
        h = skinny.add_layer_norm(x, None, self.mlp_ln.weight, self.mlp_ln.bias, self.mlp_ln.eps)[1]
        hidden = skinny.linear(h, self.mlp[0].weight, self.mlp[0].bias, gelu=True,
                               prefetch=_prefetch(self.mlp[0].weight))
        return skinny.linear(hidden, self.mlp[2].weight, self.mlp[2].bias, residual=x,
                             prefetch=_prefetch(self.mlp[2].weight))

    def decode_full(
        self, x: Tensor, cross_k: Tensor, cross_v: Tensor, heads: Sequence[int] = ()
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """A whole causal sequence without a cache; also the cross-attention scores of ``heads``.

        The scores are the scaled pre-softmax q.k products [B, len(heads), T, n_audio_ctx]
        (None when no head is asked for).
        """
        h = self.attn_ln(x)
        q = self.attn.split_heads(self.attn.query(h))
        k, v = self.attn.project_kv(h)
        out = attention(q, k, v, is_causal=True)
        x = x + self.attn.out(self.attn.merge_heads(out))
        h = self.cross_attn_ln(x)
        q = self.cross_attn.query(h)
        scores = None
        if heads:
            index = torch.tensor(list(heads), device=x.device)
            qh = self.cross_attn.split_heads(q).index_select(1, index)
            scale = qh.shape[-1] ** -0.5
            scores = (qh * scale) @ cross_k.index_select(1, index).transpose(-1, -2)
        x = x + self.cross_attn.attend(q, cross_k, cross_v)
        return x + self.mlp(self.mlp_ln(x)), scores


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding",
                             torch.empty(n_ctx, n_state) if _on_meta() else sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList([ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer)])
        self.ln_post = nn.LayerNorm(n_state)

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B, n_mels, 2 * n_ctx] -> [B, n_ctx, n_state]."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))
        x = x.transpose(1, 2)
        if x.shape[1] != self.positional_embedding.shape[0]:
            raise ValueError(
                f"encoder expects {2 * self.positional_embedding.shape[0]} mel frames, got {mel.shape[-1]}"
            )
        # Written [B, T, C]-contiguous: an add keeps its input's transposed layout, and every later
        # residual add and layer norm would then run strided or copy (a third of the encoder's time
        # on an H100 at large-v3, batch 16).
        x = torch.add(x, self.positional_embedding,
                      out=x.new_empty(x.shape, dtype=torch.result_type(x, self.positional_embedding)))
        for block in self.blocks:
            x = block.encode(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.n_ctx = n_ctx
        self.n_head = n_head
        weight = torch.empty(n_vocab, n_state) if _on_meta() else None  # no random init on meta
        self.token_embedding = nn.Embedding(n_vocab, n_state, _weight=weight)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        self.blocks = nn.ModuleList(
            [ResidualAttentionBlock(n_state, n_head, cross_attention=True) for _ in range(n_layer)]
        )
        self.ln = nn.LayerNorm(n_state)

    def pack_self_attention(self, in_major: bool = False) -> None:
        """Pack every block's self-attention q/k/v weights for the fused step (see ``pack_qkv``).
        ``in_major``: store them, and every other weight a decode step multiplies by (the vocabulary
        product's too: the token embedding's), [in, out], the layout a few rows on an Intel CPU run
        fastest in (see ``cpu_linear``)."""
        for block in self.blocks:
            block.attn.pack_qkv(in_major)
        if in_major:
            cpu_linear.store_in_major([self.token_embedding.weight] + [
                layer.weight for block in self.blocks
                for layer in (block.attn.out, block.cross_attn.query, block.cross_attn.out, block.mlp[0], block.mlp[2])
            ])

    def cross_kv(self, audio_features: Tensor) -> List[Tuple[Tensor, Tensor]]:
        """Every layer's cross-attention keys/values [B, H, n_audio_ctx, D]: computed once per window."""
        return [block.cross_attn.project_kv(audio_features) for block in self.blocks]

    def write_cross_kv(self, audio_features: Tensor, keys: List[Tensor], values: List[Tensor], rows: Tensor) -> None:
        """Project one window's cross-attention K/V ([1, n_audio_ctx, d] features) and copy it into
        ``rows`` of the per-layer buffers [rows, H, n_audio_ctx, D], one layer at a time: the transient
        memory is one layer of one window, and a window's values do not depend on the other windows."""
        head_dim = keys[0].shape[-1] if len(keys) else 0
        one_slot = len(rows) == 1 and kernels_can_run(audio_features) and head_dim & (head_dim - 1) == 0
        for block, k_buf, v_buf in zip(self.blocks, keys, values):
            if one_slot:  # straight from the projection's rows into the head-major slot (one kernel each)
                cross = block.cross_attn
                slot_write.write_slot(cross.key(audio_features), k_buf, rows)
                slot_write.write_slot(cross.value(audio_features), v_buf, rows)
                continue
            k, v = block.cross_attn.project_kv(audio_features)
            k_buf.index_copy_(0, rows, k.expand(len(rows), *k.shape[1:]))
            v_buf.index_copy_(0, rows, v.expand(len(rows), *v.shape[1:]))

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        self_k: List[Tensor],
        self_v: List[Tensor],
        cross_k: List[Tensor],
        cross_v: List[Tensor],
        *,
        filled: Optional[int] = None,
        cross_group: int = 1,
        cross_rows: Optional[Tensor] = None,
        logits_at: Union[int, Tensor, None] = None,
        float_logits: bool = True,
    ) -> Tensor:
        """Run ``tokens`` [B, T] at ``positions`` [B, T]; return float32 logits [B, T, n_vocab]
        (``float_logits=False``: the fused operators leave them in the model's dtype, for a reader
        that converts them itself; the plain path's are float32 either way).

        ``self_k``/``self_v`` are per-layer caches [B, H, n_ctx, D] (views of persistent buffers);
        keys at positions greater than a query's own position are masked, so stale cache entries
        never leak into the result. ``filled``: a bound on every position (the keys past it are not
        read). ``cross_group``: rows in consecutive groups of this size share one row of the
        cross-attention caches (a window's beams: ``cross_k``/``cross_v`` are [B / group, H, S, D]),
        read once per group. ``cross_rows``: an integer tensor [B / cross_group] on the device naming
        the cross-attention row each group reads (a graph's input: one capture serves every slot);
        None: group g reads row g. ``logits_at``: the logits of that position only ([B, 1, n_vocab]); an
        integer tensor [B] on the device names each row's own position.

        In half precision on CUDA the fused operators run it (several tokens per row, a prompt's
        prefill, as rows of their own); a row's result then does not depend on the other rows.
        """
        b, t = tokens.shape
        weight = self.token_embedding.weight
        head_dim = weight.shape[-1] // self.n_head
        if fused_step_enabled(weight, head_dim):
            # every token a row of the fused operators; a query sees the keys up to its own position
            x, lengths = embedding_ops.embed_rows(tokens, positions, weight, self.positional_embedding)
            self_rows = write_index = None
            if t > 1:  # reading its row's cache
                self_rows = torch.arange(b, device=x.device).repeat_interleave(t)
                write_index = positions[:, None, :, None].expand(b, self.n_head, t, head_dim)
            for i, block in enumerate(self.blocks):
                x = block.decode_fused(x, self_k[i], self_v[i], lengths, cross_k[i], cross_v[i], cross_group * t,
                                       cross_rows, self_rows, write_index)
            if logits_at is not None and t > 1:
                x = _at_positions(x.view(b, t, -1), logits_at)[:, 0].contiguous()
            x = skinny.add_layer_norm(x, None, self.ln.weight, self.ln.bias, self.ln.eps)[1]
            logits = skinny.linear(x, weight, prefetch=_prefetch(weight))
            return (logits.float() if float_logits else logits).view(b, -1, logits.shape[-1])
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        write_index = positions[:, None, :, None].expand(b, self.n_head, t, head_dim)
        keys = self.n_ctx if filled is None else min(int(filled), self.n_ctx)
        key_positions = torch.arange(keys, device=tokens.device)
        self_mask = (key_positions[None, None, None, :] <= positions[:, None, :, None])
        for i, block in enumerate(self.blocks):
            ck, cv = cross_k[i], cross_v[i]
            if cross_rows is not None:  # a copy of the rows read (one layer's at a time)
                ck, cv = ck.index_select(0, cross_rows), cv.index_select(0, cross_rows)
            x = block.decode(x, self_k[i], self_v[i], write_index, self_mask, ck, cv, cross_group, keys)
        if logits_at is not None:
            x = _at_positions(x, logits_at)
        x = self.ln(x)
        # x @ weight.T; on the CPU a few rows in the orientation MKL runs fast (see ops.cpu_linear)
        return cpu_linear.linear(x, self.token_embedding.weight).float()

    def forward_with_cross_scores(
        self, tokens: Tensor, cross_k: List[Tensor], cross_v: List[Tensor], heads: Sequence[Tuple[int, int]]
    ) -> Tuple[Tensor, Tensor]:
        """Run full sequences ``tokens`` [B, T] (positions 0..T-1, no cache) for word alignment.

        Returns float32 logits [B, T, n_vocab] and the pre-softmax cross-attention scores of the
        (layer, head) pairs in ``heads``, in that order: [B, len(heads), T, n_audio_ctx]. This is
        a separate path from the cached decode step, which it leaves untouched.
        """
        t = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positional_embedding[:t]
        per_layer: List[List[int]] = [[] for _ in self.blocks]
        for layer, head in heads:
            per_layer[layer].append(head)
        found = {}
        for i, block in enumerate(self.blocks):
            x, scores = block.decode_full(x, cross_k[i], cross_v[i], per_layer[i])
            for n, head in enumerate(per_layer[i]):
                found[(i, head)] = scores[:, n]
        x = self.ln(x)
        logits = (x @ self.token_embedding.weight.T).float()
        return logits, torch.stack([found[(layer, head)] for layer, head in heads], dim=1)


def _at_positions(x: Tensor, at: Union[int, Tensor]) -> Tensor:
    """[B, 1, d]: position ``at`` of each row of x [B, T, d] (an int, or a tensor [B] of positions)."""
    if isinstance(at, Tensor):
        return x[torch.arange(x.shape[0], device=x.device), at][:, None]
    return x[:, at : at + 1]


class Whisper(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer)
        self.decoder = TextDecoder(dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer)

    @classmethod
    def from_state_dict(cls, dims: WhisperDims, state_dict: dict) -> "Whisper":
        """Build the model around the checkpoint's tensors without an extra full-size copy."""
        with torch.device("meta"):
            model = cls(dims)
        state = dict(state_dict)
        # Older or converted checkpoints may omit the fixed encoder position table.
        state.setdefault("encoder.positional_embedding", sinusoids(dims.n_audio_ctx, dims.n_audio_state))
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise KeyError(f"checkpoint does not match Whisper: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model
