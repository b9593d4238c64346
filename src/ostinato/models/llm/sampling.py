"""Choosing the next token on the device: greedy, or sampled with temperature, top-k and top-p.

Sampling draws Gumbel noise from a counter-based hash of (the row's seed, how many tokens the row
has made, the token id) instead of a generator's stream, so a prompt's tokens depend on its seed
alone: not on which rows it shared a batch with, on the bucket it ran in, or on graph replays. The
noise is graph-safe (pure integer arithmetic) and the same on the CPU and on CUDA.
"""
from __future__ import annotations

import torch
from torch import Tensor

_MASK = 0xFFFFFFFF
_MIX = 0x45D9F3B  # an odd 27-bit multiplier: products of 32-bit values stay inside int64


def _mix(x: Tensor) -> Tensor:
    x = ((x ^ (x >> 16)) * _MIX) & _MASK
    x = ((x ^ (x >> 16)) * _MIX) & _MASK
    return x ^ (x >> 16)


def row_seed(seed: int, index: int) -> int:
    """The 32-bit seed of the ``index``-th prompt of a call seeded with ``seed``."""
    x = torch.tensor([(seed & _MASK) ^ ((index * 0x9E3779B9) & _MASK)], dtype=torch.int64)
    return int(_mix(_mix(x) ^ ((seed >> 32) & _MASK))[0])


def gumbel_noise(seeds: Tensor, counters: Tensor, vocab: int) -> Tensor:
    """[B, vocab] float32 Gumbel(0, 1) noise, a pure function of (seed, counter, token id)."""
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    base = _mix((seeds & _MASK) ^ ((counters * 0x27D4EB2F) & _MASK))
    bits = _mix((base[:, None] ^ ids[None, :]) & _MASK)
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), exact in float32
    return -torch.log(-torch.log(uniform))


def choose(logits: Tensor, sample: bool, temperature: Tensor, top_k: Tensor, top_p: Tensor, seeds: Tensor,
           counters: Tensor) -> Tensor:
    """The next token of each row from float32 ``logits`` [B, V]. Per row: ``temperature`` > 0,
    ``top_k`` (0: all), ``top_p`` in (0, 1]; ``seeds`` and ``counters`` index the noise."""
    if not sample:
        return logits.argmax(dim=-1)
    vocab = logits.shape[-1]
    scaled = logits / temperature[:, None]
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    keep = (top_k[:, None] <= 0) | (rank[None, :] < top_k[:, None])
    ordered = ordered.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    # keep the smallest prefix whose probability reaches top_p (the most likely token always stays)
    keep &= (probs.cumsum(dim=-1) - probs) < top_p[:, None]
    ordered = ordered.masked_fill(~keep, float("-inf"))
    noise = gumbel_noise(seeds, counters, vocab).gather(1, order)
    return order.gather(1, (ordered + noise).argmax(dim=-1, keepdim=True)).squeeze(1)
