"""Decoding rows of a language model on the row scheduler: prefill on admission, then one token per
row per step, chosen and fed back on the device.

The state (KV caches, conv and recurrent states, each row's token, position, counters, sampling
settings and output) is allocated once for ``rows`` x ``capacity`` and grows only when a call
needs more (captured graphs are then dropped, since they hold the old addresses). On CUDA the step
is captured per batch-size bucket and repeated by the device while-loop until a row finishes
while prompts wait for a row, every row has finished, or a streaming caller wants to see tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ...runtime import DeviceState, SlotTable, StepGraph, host_values_to_device
from . import fusion
from .network import DecoderNet
from .sampling import choose

MAX_STOP_IDS = 16  # end-of-sequence and stop ids a run compares each token against


class GenerationKey(NamedTuple):
    """A run's rows and whether it samples (a greedy run skips the sampling ops)."""
    rows: int
    sample: bool


@dataclass
class PromptRequest:
    ids: List[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop_ids: tuple


@dataclass
class RowOutput:
    ids: List[int]
    finished_by_stop: bool


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _doubled(size: int, old: int, limit: int) -> int:
    """``size`` where it is ``old`` (no growth), else at least twice ``old`` within ``limit``."""
    return size if size == old else max(size, min(2 * old, limit))


class LLMDecoder:
    """Owns the decode state and the step graph of one model on one device."""

    def __init__(self, net: DecoderNet, device: torch.device, use_graphs: bool, decode_loop: str,
                 steps_per_replay: int = 4, prefill_chunk: int = 4096, prefill_tokens: int = 8192,
                 compile_step: bool = False):
        self.net, self.device = net, device
        # torch.compile fuses the step's many small ops (norms, rotary, gates) into few kernels; the
        # compiled step is then captured like any other, so the graph replays the fused kernels
        self.compile_step = compile_step
        self._decode = net.decode
        if compile_step:
            import torch._dynamo

            # the first bucket compiles with its sizes fixed; a second bucket recompiles once with the
            # row count symbolic, which then serves every further bucket
            config = torch._dynamo.config
            config.cache_size_limit = max(config.cache_size_limit, 64)
            config.accumulated_cache_size_limit = max(config.accumulated_cache_size_limit, 512)
            self._decode = torch.compile(net.decode, dynamic=None)
        self._primed = set()
        self.use_graphs, self.decode_loop = use_graphs, decode_loop
        self.steps_per_replay = steps_per_replay
        self.prefill_chunk, self.prefill_tokens = prefill_chunk, prefill_tokens
        self.state: Optional[DeviceState] = None
        self.graph: Optional[StepGraph] = None
        self.rows = self.capacity = self.max_new = 0

    # -- state -----------------------------------------------------------------------------------
    def ensure(self, rows: int, capacity: int, max_new: int) -> None:
        """State for ``rows`` rows of ``capacity`` positions and ``max_new`` new tokens, kept if it
        fits. Past the first allocation, a context or new-token room that must grow becomes at least
        twice what it was (within the model's context): a conversation whose prompt grows by a turn
        a call reallocates, and captures its graphs again, a few times rather than at every call.
        Where the doubled state does not fit the device, it is made as large as the call needs."""
        if self.state is not None and rows <= self.rows and capacity <= self.capacity and max_new <= self.max_new:
            return
        exact = (max(rows, self.rows), max(_round_up(capacity, 128), self.capacity),
                 max(_round_up(max_new, 64), self.max_new))
        grown = exact
        if self.state is not None:
            limit = self.net.config.max_position_embeddings
            grown = (exact[0], _doubled(exact[1], self.capacity, limit), _doubled(exact[2], self.max_new, limit))
        self.state = self.graph = None  # free the old buffers (and graphs that address them) first
        try:
            self._allocate(*grown)
            return
        except torch.OutOfMemoryError:
            if grown == exact:
                raise
        self._allocate(*exact)  # past the except block: the failed attempt's buffers went with its traceback

    def _allocate(self, rows: int, capacity: int, max_new: int) -> None:
        st = DeviceState(self.device)
        for name, (shape, dtype) in self.net.state_spec(rows, capacity).items():
            st.allocate(name, shape, dtype)
        i64 = torch.int64
        for name in ("tokens", "positions", "n_new", "limit", "top_k", "seeds"):
            st.allocate(name, (rows,), i64)
        st.allocate("active", (rows,), torch.bool)
        st.allocate("temperature", (rows,), torch.float32, 1.0)
        st.allocate("top_p", (rows,), torch.float32, 1.0)
        st.allocate("out", (rows, max_new), i64)
        st.allocate("stop_ids", (MAX_STOP_IDS,), i64, -1)
        for name in ("stop_after", "active_floor", "steps", "step_end", "every"):
            st.allocate(name, (1,), i64)
        self.state, self.rows, self.capacity, self.max_new = st, rows, capacity, max_new
        options = {}
        if self.decode_loop == "device":
            options = dict(loop_guard=self._loop_guard,
                           max_loop_trips=math.ceil(max_new / self.steps_per_replay) + 2)
        # K steps a call: a graph of K unrolled steps, or on the device loop one captured step K times a trip
        self.graph = StepGraph(self.step, self.device, use_graphs=self.use_graphs and self.decode_loop != "eager",
                               steps_per_replay=self.steps_per_replay, name="language model decode step", **options)

    # -- the step ----------------------------------------------------------------------------------
    def _loop_guard(self, key: GenerationKey, entering: bool) -> Tensor:
        """Another trip while some row is active, fewer than ``stop_after`` rows finished since entry,
        and (for a streaming caller) fewer than ``every`` steps ran since entry."""
        st = self.state
        active = st["active"][: key.rows].sum()
        if entering:
            torch.clamp(active - st["stop_after"], min=0, out=st["active_floor"])
            torch.add(st["steps"], st["every"], out=st["step_end"])
        return ((active > st["active_floor"]) & (st["steps"] < st["step_end"])).reshape(())

    def step(self, key: GenerationKey) -> None:
        """One token for every active row of the first ``key.rows`` rows, written in place."""
        st, b = self.state, key.rows
        tokens, positions = st["tokens"][:b], st["positions"][:b]
        logits = self._decode(tokens, positions, self.state, b)
        n_new, active = st["n_new"][:b], st["active"][:b]
        chosen = choose(logits, key.sample, st["temperature"][:b], st["top_k"][:b], st["top_p"][:b],
                        st["seeds"][:b], n_new)
        rows = torch.arange(b, device=self.device)
        column = n_new.clamp(max=self.max_new - 1)
        out = st["out"]
        out[rows, column] = torch.where(active, chosen, out[rows, column])
        stopped = (chosen[:, None] == st["stop_ids"][None, :]).any(dim=-1)
        counted = n_new + active.long()
        finished = active & (stopped | (counted >= st["limit"][:b]))
        n_new.copy_(counted)
        positions.copy_(torch.clamp(positions + active.long(), max=self.capacity - 1))
        active.copy_(active & ~finished)
        tokens.copy_(chosen)
        st["steps"].add_(1)

    def prime(self, key: GenerationKey) -> None:
        """Compile the step for ``key`` before its graph is captured (compiling inside the capture's
        warm-up would trip its no-sync check). Steps inactive rows only."""
        if self.compile_step and (key, self.capacity) not in self._primed:
            self.step(key)
            self._primed.add((key, self.capacity))

    # -- prefill -----------------------------------------------------------------------------------
    def prefill(self, slots: Sequence[int], requests: Sequence[PromptRequest], sample: bool) -> None:
        """Load prompts into rows ``slots``: their state from the prompt, their first token chosen."""
        by_length: Dict[int, List[int]] = {}
        for i, r in enumerate(requests):
            by_length.setdefault(len(r.ids), []).append(i)
        for length, members in by_length.items():
            per_call = max(1, self.prefill_tokens // min(length, self.prefill_chunk))
            for first in range(0, len(members), per_call):
                group = members[first:first + per_call]
                self._prefill_group([slots[i] for i in group], [requests[i] for i in group], sample)

    def _prefill_group(self, slots: List[int], requests: List[PromptRequest], sample: bool) -> None:
        st, device = self.state, self.device
        # the rows, prompts and settings through pinned memory: a copy from pageable host memory
        # would wait for all the work queued ahead of it (an earlier group's prefill, a decode trip)
        rows = host_values_to_device(slots, device)
        ids = host_values_to_device([r.ids for r in requests], device)
        floats = host_values_to_device([[r.temperature if sample else 1.0 for r in requests],
                                        [r.top_p for r in requests]], device, torch.float32)
        ints = host_values_to_device([[r.top_k for r in requests], [r.seed for r in requests],
                                      [r.max_new_tokens for r in requests], [len(r.ids) for r in requests]], device)
        self.net.reset_rows(st, rows)
        hidden = None
        with fusion.enabled(self.compile_step):  # the prefill's norms and gates as one kernel each
            for start in range(0, ids.shape[1], self.prefill_chunk):
                hidden = self.net.prefill(ids[:, start:start + self.prefill_chunk], rows, start, st)[:, -1]
        logits = self.net.logits(hidden)
        st["temperature"].index_copy_(0, rows, floats[0])
        st["top_p"].index_copy_(0, rows, floats[1])
        st["top_k"].index_copy_(0, rows, ints[0])
        st["seeds"].index_copy_(0, rows, ints[1])
        limits = ints[2]
        zeros = torch.zeros(len(slots), dtype=torch.int64, device=device)
        first = choose(logits, sample, st["temperature"][rows], st["top_k"][rows], st["top_p"][rows],
                       st["seeds"][rows], zeros)
        st["out"][rows, 0] = first
        stopped = (first[:, None] == st["stop_ids"][None, :]).any(dim=-1)
        st["n_new"].index_fill_(0, rows, 1)
        st["limit"].index_copy_(0, rows, limits)
        st["active"].index_copy_(0, rows, ~stopped & (limits > 1))
        st["tokens"].index_copy_(0, rows, first)
        st["positions"].index_copy_(0, rows, ints[3])


class GenerationRun(SlotTable):
    """The rows of one bucket: prompts admitted into free rows, decoded until each stops."""

    def __init__(self, decoder: LLMDecoder, key: GenerationKey, stop_ids: Sequence[int], stream_every: int = 0):
        super().__init__(key.rows)
        self.decoder, self.key = decoder, key
        st = decoder.state
        stop = list(stop_ids)[:MAX_STOP_IDS]
        st["stop_ids"].fill_(-1)
        if stop:
            st["stop_ids"][: len(stop)] = torch.tensor(stop, dtype=torch.int64).to(decoder.device)
        st["active"][: key.rows].fill_(False)
        st["every"].fill_(stream_every if stream_every > 0 else 1 << 40)
        graph = decoder.graph
        if graph.use_graphs and not graph.is_captured(key) and graph.mode(key) != "eager":
            decoder.prime(key)
            graph.capture(key)  # warm-up and capture step every row: all inactive now
            st["active"][: key.rows].fill_(False)

    def admit(self, requests: Sequence[PromptRequest]) -> List[int]:
        slots = self.take(len(requests))
        self.decoder.prefill(slots, requests, self.key.sample)
        for slot, request in zip(slots, requests):
            self.occupy(slot, request)
        return slots

    def advance(self, refill: bool = False) -> None:
        self.decoder.state["stop_after"].fill_(1 if refill else self.key.rows)
        self.decoder.graph(self.key)

    def evict(self, slot: int) -> None:
        self.decoder.state["active"][slot] = False
        self.release(slot)

    def peek(self, slot: int) -> List[int]:
        """The tokens a row has made so far (a host sync: for streaming callers)."""
        st = self.decoder.state
        count = int(st["n_new"][slot])
        return st["out"][slot, :count].tolist()

    def collect(self) -> Dict[int, RowOutput]:
        st = self.decoder.state
        rows = self.key.rows
        active, counts = torch.stack([st["active"][:rows].long(), st["n_new"][:rows]]).tolist()
        finished = [slot for slot in self.slots() if not active[slot]]
        if not finished:
            return {}
        width = max(counts[slot] for slot in finished)
        outputs = st["out"][torch.tensor(finished, device=self.decoder.device), :width].tolist()
        results = {}
        for slot, ids in zip(finished, outputs):
            ids = ids[: counts[slot]]
            request = self[slot]
            results[slot] = RowOutput(ids, bool(ids) and ids[-1] in request.stop_ids)
            self.release(slot)
        return results
