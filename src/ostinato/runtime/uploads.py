"""Host arrays to the device without stalling it: padded batches filled into pinned memory by a worker
thread and copied on a side stream, so that the host's fill and the copy of one batch overlap the
device's work on the batch before. On the CPU the same calls give plain padded tensors."""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, List, Sequence

import numpy as np
import torch
from torch import Tensor


def padded_host_batch(arrays: Sequence[np.ndarray], pinned: bool) -> Tensor:
    """[B, longest] float32 on the host (pinned if asked), each 1-D array's row zero-padded."""
    width = max(int(a.shape[0]) for a in arrays)
    host = torch.empty(len(arrays), width, dtype=torch.float32, pin_memory=pinned)
    for i, a in enumerate(arrays):  # torch's copy runs on several threads (a large numpy one on one)
        host[i, : a.shape[0]].copy_(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
        host[i, a.shape[0]:].zero_()
    return host


def host_values_to_device(values: List[int], device: torch.device) -> Tensor:
    """A small int64 tensor on ``device`` without waiting for the device (``torch.tensor(values,
    device=cuda)`` copies from pageable memory and so waits for all queued work)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload_batches(batches: Iterable[Sequence[np.ndarray]], device: torch.device, ahead: int = 2) -> Iterator[Tensor]:
    """Each batch of 1-D arrays as a padded [B, longest] float32 tensor on ``device``, in order, ready
    for the current stream. On CUDA up to ``ahead`` batches are filled and copied ahead of the one
    the caller is using: the caller's stream waits for a batch's copy only when it is yielded."""
    if device.type != "cuda":
        for arrays in batches:
            yield padded_host_batch(arrays, pinned=False).to(device)
        return
    consumer = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    pending: deque = deque()
    batches = iter(batches)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ostinato-upload") as pool:
        def start_next() -> None:
            arrays = next(batches, None)
            if arrays is not None:
                pending.append(pool.submit(padded_host_batch, arrays, True))

        for _ in range(max(1, ahead)):
            start_next()
        while pending:
            host = pending.popleft().result()
            start_next()
            with torch.cuda.stream(side):
                batch = host.to(device, non_blocking=True)
            consumer.wait_stream(side)
            batch.record_stream(consumer)  # allocated on the side stream, read on the consumer's
            yield batch
