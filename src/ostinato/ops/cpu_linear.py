"""A linear layer for a few rows on the CPU, in the orientation that MKL runs fast.

On a 2-core EPYC, MKL's ``x @ weight.T`` with 1-8 rows and its one-column ``weight @ x.T`` both took
2-3.5x as long as ``weight @ x.T`` with 2-8 columns (Whisper's [51864 x 384] vocabulary product:
8.2 ms at one row, 2.75 ms at two to four; the transducer LSTM's [2560 x 1280]: 0.83 against 0.40 ms
at two rows). The result differs from ``F.linear`` only in the last bits (another summation order).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

FEW_ROWS = 8  # up to this many rows the CPU takes weight @ x^T


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on the CPU with at most ``FEW_ROWS`` rows computed as
    weight @ x^T with at least two columns (one row goes in twice)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not 0 < rows <= FEW_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, flat])
    out = torch.mm(weight, flat.T) if bias is None else torch.addmm(bias[:, None], weight, flat.T)
    return out[:, :rows].T.contiguous().view(*x.shape[:-1], weight.shape[0])
