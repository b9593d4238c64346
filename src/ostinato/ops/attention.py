"""Scaled dot-product attention whose first call at a new shape costs no more than the next.

On CUDA, PyTorch (2.11, Hopper) ranks cuDNN's attention first, and cuDNN builds an execution plan
for every new shape: measured on an H200 (cuDNN 9.19), 45-70 ms at each new sequence length and
0.74 s for the first, against 0.2 ms for the flash and memory-efficient kernels, which need no plan.
Every Whisper prompt, segment alignment or LLM prompt brings a length of its own: in a first
transcription of 19 clips and a 6-minute recording, 0.83 s went to cuDNN's plans. These calls leave
cuDNN out; so does Whisper's encoder, whose one shape would still pay one plan (50-70 ms) in every
process for a kernel that saves less per window (large-v3's shape at 16 windows: 0.48 against
0.66 ms a layer). On the CPU nothing changes.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _PLAN_FREE = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
except ImportError:  # pragma: no cover - older PyTorch: its default backends
    sdpa_kernel = None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              is_causal: bool = False, **options) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` without cuDNN's backend on CUDA."""
    if q.device.type != "cuda" or sdpa_kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)
    with sdpa_kernel(_PLAN_FREE):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)
