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
on how many rows come with it, nor where it stands among them. They differ from ``F.linear`` only
in the last bits.

That takes MKL's strict reproducibility mode (``MKL_CBWR=AUTO,STRICT``), which this module's import
asks MKL for: without it a lone row is summed in another order than the same row among others, and
from 9 rows on some shapes (tiny.en's [384 x 1536] at 20-80 rows stored [in, out], 9-15 stored
[out, in]) split their sums by the row count. With it every row count up to a batch of 16 beam-5
windows was measured row by row the same, at the same speed. MKL takes the mode only before its
first call in the process: where it was in use already (``rows_alone_at_any_count`` is False, and
``reproducibility`` says why) a lone row goes in twice, which keeps up to ``FEW_ROWS`` rows alone.
``MKL_CBWR`` set by the user, or ``OSTINATO_MKL_STRICT=0``, leaves the mode as it is.

A lone row (greedy decoding of one window, a transducer's label step) against a weight stored
[in, out] runs on MKL's one-row kernel (gemv) by default: on the Xeon 2-4x as fast as the same row
in a matrix product (the vocabulary product 3.1-3.5 ms against 5.8-5.9 at two threads, [1152 x 384]
0.017 against 0.055 ms in cache). On the EPYC the one-column product was the slow one (8.2 ms against
2.75 at two columns), so a weight stored [out, in] keeps the doubled row. gemv sums in another order,
so its last bits differ from the same row's among others: a greedy window alone and in a batch then
agree to rounding, not to the bit. ``OSTINATO_CPU_BATCH_INVARIANT=1`` (``batch_invariant``) computes
a lone row as it would be among others instead, at the matrix product's speed, where the same bits
at every batch size matter more.
"""
from __future__ import annotations

import ctypes
import glob
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
INVARIANT_VARIABLE = "OSTINATO_CPU_BATCH_INVARIANT"  # "1": a lone row's bits as among others (no gemv)
_GEMV_DTYPES = (torch.float32, torch.float64)  # MKL's gemv; other dtypes take the matrix product
STRICT_VARIABLE = "OSTINATO_MKL_STRICT"  # "0": leave MKL's reproducibility mode as it is
_MKL_CBWR_ALL, _MKL_CBWR_AUTO, _MKL_CBWR_STRICT, _MKL_CBWR_MODE_CHANGE_FAILURE = -1, 2, 0x10000, -8


def _ask_mkl_for_strict_mode() -> str:
    """Put the process's MKL in strict reproducibility mode if it is not yet; returns "on", or
    "off (why)". MKL's mkl_cbwr_get/set are in libtorch_cpu under their service names."""
    if not torch.backends.mkl.is_available():
        return "off (PyTorch has no MKL)"
    try:
        path = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*")))[0]
        library = ctypes.CDLL(path)  # (already loaded: the same library PyTorch runs)
        get, put = library.mkl_serv_cbwr_get, library.mkl_serv_cbwr_set
    except (IndexError, OSError, AttributeError):
        return "off (this MKL has no reproducibility mode to ask for)"
    get.argtypes = put.argtypes = [ctypes.c_int]
    if get(_MKL_CBWR_ALL) & _MKL_CBWR_STRICT:
        return "on"
    if "MKL_CBWR" in os.environ or os.environ.get(STRICT_VARIABLE, "").strip() == "0":
        return "off (MKL_CBWR or OSTINATO_MKL_STRICT=0 set it)"
    status = put(_MKL_CBWR_AUTO | _MKL_CBWR_STRICT)
    if status == 0:
        return "on"
    if status == _MKL_CBWR_MODE_CHANGE_FAILURE:
        return "off (MKL was in use before ostinato's model code was imported)"
    return f"off (MKL said {status})"


_STRICT_MODE = _ask_mkl_for_strict_mode()
rows_alone_at_any_count = _STRICT_MODE == "on"  # each row's bits the same in any company, a lone row too
batch_invariant = os.environ.get(INVARIANT_VARIABLE, "").strip() == "1"  # else a lone row runs on gemv


def reproducibility() -> str:
    """MKL's strict reproducibility mode for this process: "on", or "off (why)"."""
    return _STRICT_MODE


def lone_rows(layout: str) -> str:
    """How a lone row against weights stored in ``layout`` is computed, for the log: on MKL's
    one-row kernel, or as among others."""
    if batch_invariant:
        return f"as among others ({INVARIANT_VARIABLE}=1)"
    return "on the one-row kernel" if layout == "in-major" else "as among others"


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on the CPU at most ``FEW_ROWS`` rows computed as
    ``x @ weight.T`` where the weight is stored [in, out] (``is_in_major``; a lone float row there
    on MKL's one-row kernel unless ``batch_invariant``), else as weight @ x^T, a lone row twice
    unless MKL is in strict mode."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not 0 < rows <= FEW_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    in_major = is_in_major(weight)
    if rows == 1 and in_major and not batch_invariant and flat.dtype in _GEMV_DTYPES:
        out = torch.mv(weight, flat[0]) if bias is None else torch.addmv(bias, weight, flat[0])
        return out.view(*x.shape[:-1], weight.shape[0])
    if rows == 1 and not rows_alone_at_any_count:
        flat = torch.cat([flat, flat])
    if in_major:
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
