"""A linear layer for a few rows on the CPU, in the orientation that MKL runs fast.

Which orientation that is depends on the processor, since MKL picks its kernels by the vendor:
- On a 2-core EPYC, ``x @ weight.T`` with 1-8 rows and the one-column ``weight @ x.T`` both took
  2-3.5x as long as ``weight @ x.T`` with 2-8 columns (Whisper's [51864 x 384] vocabulary product:
  8.2 ms at one row, 2.75 ms at two to four; the transducer LSTM's [2560 x 1280]: 0.83 against 0.40
  ms at two rows).
- On two cores of an AMX-era Xeon, that ``weight @ x.T`` is the slow one (the vocabulary product
  8.6 ms at one to eight columns, tiny.en's [1536 x 384] 0.12 ms). ``x @ W`` with the weight
  stored [in, out] takes 4.3 and 0.04 ms at one or two rows (6.2 and 0.05 at four); a label step of
  a Parakeet-sized transducer (prediction net and joint) 1.34-1.45 ms at one to four rows, not 1.55-1.63.
So a model loaded on an Intel CPU stores the weights its decode step multiplies [in, out]
(``store_in_major``: the parameter becomes a transposed view, still one copy), and ``linear`` runs
such a weight as ``x @ W``. Both orientations compute each row alone: a row's result does not depend
on how many rows come with it, nor where it stands among them (one row goes in twice, as the
kernel for one row sums in another order). They differ from ``F.linear`` only in the last bits.
"""
from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

FEW_ROWS = 8  # up to this many rows the CPU takes one of the orientations above
LAYOUT_VARIABLE = "OSTINATO_CPU_WEIGHT_LAYOUT"  # "in-major" or "out-major": overrides the choice by vendor
LAYOUTS = ("in-major", "out-major")


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on the CPU with at most ``FEW_ROWS`` rows computed as
    ``x @ weight.T`` where the weight is stored [in, out] (``is_in_major``), else as weight @ x^T,
    with at least two rows or columns (one row goes in twice)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not 0 < rows <= FEW_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, flat])
    if is_in_major(weight):
        out = torch.mm(flat, weight.T) if bias is None else torch.addmm(bias, flat, weight.T)
        return out[:rows].view(*x.shape[:-1], weight.shape[0])
    out = torch.mm(weight, flat.T) if bias is None else torch.addmm(bias[:, None], weight, flat.T)
    return out[:, :rows].T.contiguous().view(*x.shape[:-1], weight.shape[0])


def is_in_major(weight: Tensor) -> bool:
    """Whether a [out, in] weight is stored [in, out]: a transposed view (or a slice of one, such as
    one of packed q/k/v), whose rows ``x @ weight.T`` reads without a copy."""
    return weight.dim() == 2 and weight.stride(0) == 1 and weight.stride(1) >= weight.shape[0] > 1


def store_in_major(weights: Iterable[Tensor]) -> None:
    """Store each weight [out, in] as [in, out], in place of the old storage (its tensor keeps its
    identity, shape and values: it becomes a transposed view). Idempotent."""
    with torch.no_grad():
        for weight in weights:
            if not is_in_major(weight):
                weight.data = in_major_copy(weight.data)


def in_major_copy(weight: Tensor) -> Tensor:
    """``weight``'s values stored [in, out] (a transposed view of a new tensor)."""
    return weight.T.contiguous().T


def in_major_preferred(device: torch.device) -> bool:
    """Whether few-row products on ``device`` run fastest with weights stored [in, out]: on the CPU
    where MKL runs its Intel kernels (``OSTINATO_CPU_WEIGHT_LAYOUT`` decides where set)."""
    if torch.device(device).type != "cpu":
        return False
    return _cpu_layout() == "in-major"


@lru_cache(maxsize=None)
def _cpu_layout() -> str:
    chosen = os.environ.get(LAYOUT_VARIABLE, "").strip().lower()
    if chosen in LAYOUTS:
        return chosen
    if chosen:
        log.warning("%s=%r is neither of %s: choosing by the processor", LAYOUT_VARIABLE, chosen, ", ".join(LAYOUTS))
    intel = torch.backends.mkl.is_available() and cpu_vendor() == "GenuineIntel"
    return "in-major" if intel else "out-major"


def cpu_vendor() -> str:
    """The processor's vendor string (``GenuineIntel``, ``AuthenticAMD``...), or "" where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
