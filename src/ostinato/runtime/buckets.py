"""Batch-size buckets: the row counts graphs are captured for."""
from __future__ import annotations

from typing import Sequence, Tuple

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_for(rows: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """The smallest bucket that holds ``rows`` rows."""
    for b in sorted(buckets):
        if rows <= b:
            return b
    raise ValueError(f"batch size {rows} exceeds the largest bucket {max(buckets)}")


def buckets_up_to(rows: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> Tuple[int, ...]:
    """The buckets of a state that holds ``rows`` rows: every bucket below ``rows``, and ``rows``
    itself at the top (a state is never padded past what it was asked to hold)."""
    if rows < 1:
        raise ValueError(f"a state holds at least one row, not {rows}")
    return tuple(sorted({b for b in buckets if b < rows} | {int(rows)}))
