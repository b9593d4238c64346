"""Greedy decoding of one 30-s window per row, with every per-step decision made on the device.

``WindowDecoder`` owns the device state of the decode loop (self-attention KV caches, the
cross-attention K/V of the current windows, token and rule buffers), all allocated once at the
largest batch size and written in place. A window's rows (its beams, or its samples) share one
cross-attention K/V: that buffer holds one slot per window, not one per row (for large-v3 at 16
windows of 5 beams, 3.1 GB instead of 15.7 GB). A decode step is a plain function of that state: it
runs the decoder on each row's current token, applies Whisper's logit rules, picks the next token
and feeds it back into the state, masking rows that are done. The runtime's ``StepGraph`` runs it
eagerly (CPU, ``use_graphs=False``) or as a CUDA graph per batch bucket holding
``steps_per_replay`` unrolled steps, repeated on the device until a row finishes (a device
while-loop) or, on the rung below, replayed once per call; the host looks at the done flags
once per call.

Windows are decoded in *runs* (``WindowDecoder.start``): a run fixes the search options and the
row count, captures its graphs, then admits windows into free row groups at any time, so a
window that finishes early hands its rows to the next one without waiting for the rest
(``transcribe_batch`` keeps a run full this way). ``decode`` is one run over a list of windows.

The search follows CTranslate2's (what faster-whisper runs): a prompt is split where the
start-of-transcript sequence ends; the tokens after it are a prefix that is forced, one step at a
time, and returned with the generated tokens; steps count from the start token. Besides argmax,
a step can sample (Gumbel-max on the device) with several independent rows per window
(``best_of``), the best chosen by length-normalised score. Sampling noise is a counter-based hash of (row seed, step, token id): a row's draws depend
on its own seed only, never on its neighbours in the batch, so a window samples the same tokens
alone or batched with others. Beam search lives in ``beam.py`` and shares this decoder's state
and rules.
"""
from __future__ import annotations

import random
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from ...runtime import (
    AdvanceClock, DeviceState, RowScheduler, SlotTable, StepGraph, bucket_for, concat_rows, host_values_to_device,
    loop_rung, resolve_decode_loop, store_at,
)
from ...ops import LazyModule, cpu_linear
from .beam import BeamSearch
from ...ops.triton_support import kernels_can_run
from .logit_rules import VocabLayout, apply_logit_rules
from .modules import Whisper, fused_step_supported
from .search import (  # noqa: F401 - re-exported: the decoder's request and result types
    MASK32,
    SearchOptions,
    WindowJob,
    WindowRequest,
    WindowResult,
    decode_budget,
    max_candidates,
    mix32,
    normalized_score,
    pick_best,
    prompt_length,
    row_seed,
    window_jobs,
    window_seed,
    with_seed,
)
from .tokenizer import WhisperTokenizer

KERNEL_MODULES = ("ostinato.models.whisper.rules_kernel",)  # Triton's, imported at first use (ops.LazyModule)
rules_kernel = LazyModule(KERNEL_MODULES[0])


# Admissions replay graphs for prompt heads up to this many tokens, one per length (the
# start-of-transcript sequence without a previous-text prompt: every window of a server's or a batched
# run). A longer head (the previous text as prompt: a long recording's every later window) varies in
# length window to window: where the decoder's operators compute each token alone (fused, half
# precision), it is padded to LONG_HEAD_TOKENS and replays one graph whatever its length (the pad's
# cache positions come after the head's, and every step writes its position before it reads it);
# elsewhere it runs eagerly. Eager calls pad such heads too: attention splits a head's keys by their
# count, so the same padding gives graph and eager the same bits. A head is at most the previous
# text's 224 tokens and the sequence.
PREFILL_GRAPH_TOKENS = 8
LONG_HEAD_TOKENS = 256


def default_steps_per_replay(text_layers: int) -> int:
    """Decode steps per trip of the device loop (per replay, per look at the done flags) for a
    decoder of ``text_layers`` layers: 8 for tiny's 4, 5 for base, 2 for small, 1 from medium up.

    A trip's look costs microseconds, a step of a shallow decoder a few hundred (tiny.en, H100:
    0.22 ms), so shallow decoders take 8 steps a trip. A deep decoder's step takes milliseconds while
    the driver's instantiation of a loop grows with its kernels (large-v3 at 8 steps: some 3100
    kernels, 0.43 s of its first call), and a finished row waits fewer steps for its refill."""
    return max(1, min(8, 32 // max(1, int(text_layers))))


class CrossKey(NamedTuple):
    """The graph writing one window's cross-attention K/V into its slot (an input: one graph)."""


class PrefillKey(NamedTuple):
    """The graph running the prompt heads of ``windows`` windows, ``tokens`` tokens each; the rows
    whose self-attention caches it fills and the window slots whose cross-attention K/V they read
    are inputs (one graph serves all)."""

    windows: int
    tokens: int
    # The one position whose logits are made: the start of transcript's, when in the head; PER_WINDOW:
    # heads padded to ``tokens``, each window's position an input.
    logits_at: int


PER_WINDOW = -1


def prefill_groups(count: int, together: bool) -> List[int]:
    """How many windows each prefill call of ``count`` windows with heads of one length takes: one at
    a time, or (``together``: operators whose rows do not depend on each other) the powers of two
    that sum to ``count``, largest first, so admissions of any size replay at most a handful of graphs."""
    if not together:
        return [1] * count
    return [1 << bit for bit in reversed(range(count.bit_length())) if count >> bit & 1]


class _PromptPlan(NamedTuple):
    """A window's prompt as CTranslate2 splits it: the head run into the cache, the token decoding
    starts from, and the forced prefix after it."""

    sot_index: int
    length: int  # tokens up to the end of the start-of-transcript sequence
    head: List[int]
    start: int
    prefix: List[int]


class GreedyKey(NamedTuple):
    """A greedy or sampling step graph: one per distinct value."""

    rows: int  # rows the graph steps: a bucket of windows, or windows x samples
    sample: bool = False  # Gumbel-max sampling instead of argmax
    penalize: bool = False  # a repetition penalty is on
    ngram: int = 0  # no_repeat_ngram_size (0: off)
    group: int = 1  # consecutive rows holding one window (its samples): its cross-attention K/V read once


class WindowDecoder:
    def __init__(
        self,
        model: Whisper,
        tokenizer: WhisperTokenizer,
        device: torch.device,
        *,
        use_graphs: bool = True,
        buckets: Sequence[int] = (1,),
        steps_per_replay: Optional[int] = None,
        capacity: int = 1,
        decode_loop: str = "auto",
        windows: Optional[int] = None,
    ):
        """``buckets``: batch sizes of plain greedy calls (one graph each). ``capacity``: rows the
        state holds at least, for beam search (windows x beam) and sampling (windows x best_of).
        ``windows``: the most windows decoded at once, each with one cross-attention K/V slot
        (at least the largest bucket; default: one per row).
        ``steps_per_replay``: steps per graph replay (and per look at the done flags); None: by the
        decoder's depth (``default_steps_per_replay``).
        ``decode_loop``: the top rung (see ``runtime.resolve_decode_loop``); on "device", greedy
        and sampling calls loop on the device until a row finishes, and beam search until a window
        does (one graph for every cache length: ``beam.py``)."""
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.buckets = tuple(sorted(buckets))
        dims = model.dims
        self.steps_per_replay = int(steps_per_replay or default_steps_per_replay(dims.n_text_layer))
        self.layout = VocabLayout(dims.n_vocab, tokenizer.eot, tokenizer.no_timestamps, tokenizer.timestamp_begin)
        self.max_rows = max(self.buckets[-1], int(capacity))
        self.windows = self.max_rows if windows is None else max(self.buckets[-1], int(windows))
        self.state = self._allocate_state()
        # The one-kernel logit rules serve half-precision models on CUDA; float32 keeps PyTorch's
        # ops, so its results stay the same on every device.
        dtype = model.decoder.token_embedding.weight.dtype
        self._fused_rules = kernels_can_run(self.device, dtype)
        # Prompt heads of the windows admitted together prefill in one call where the decoder's
        # operators compute each row alone (the fused ones); elsewhere a batched matrix product
        # may round a row differently from one alone, so each window keeps its own call.
        self._prefill_together = fused_step_supported(self.device, dtype, dims.n_text_state // dims.n_text_head)
        # Heads longer than PREFILL_GRAPH_TOKENS pad to LONG_HEAD_TOKENS (one graph for every length).
        self._pad_long_heads = self._prefill_together and LONG_HEAD_TOKENS <= dims.n_text_ctx
        # One q/k/v product per layer and step instead of three: each step reads the weights from memory
        # (a fused kernel on CUDA, one MKL call on the CPU); the parameters stay views, one copy. On an
        # Intel CPU the step's weights are stored [in, out], the layout MKL runs a few rows fast in there.
        model.decoder.pack_self_attention(in_major=cpu_linear.in_major_preferred(self.device))
        self.decode_loop = resolve_decode_loop(decode_loop, self.device, use_graphs)
        use_graphs = self.decode_loop != "eager"
        # A new bucket or prefill shape is captured without a warm-up run once the step has run here
        # (``mark_path_warm``, or a warm-up of another key): one pass of the step's Python, not two.
        graph_options = dict(use_graphs=use_graphs, steps_per_replay=self.steps_per_replay, warm_up_new_shapes=False)
        if self.decode_loop == "device":
            # Enough trips for a row to run from the first position to the last of the text context.
            trips = dims.n_text_ctx // self.steps_per_replay + 2
            graph_options.update(loop_guard=self._loop_guard, max_loop_trips=trips)
        self.graph = StepGraph(self._step, device, name="whisper decode step", **graph_options)
        self.sample_graph = StepGraph(self._step, device, name="whisper sampling step", **graph_options)
        # Admitting a window is hundreds of small launches (large-v3: a K/V projection per layer, a
        # decoder pass over the prompt head); replayed, the same kernels cost one launch each.
        self._cross_graph = StepGraph(self._write_cross, device, use_graphs=use_graphs,
                                      name="whisper cross-attention K/V write", warm_up_new_shapes=False)
        # Until the prefill has run here, a key's first call runs eagerly (the warm-up) and its capture
        # waits for spare time (capture_deferred); after, a key is captured at its first call.
        self._prefill_graph = StepGraph(self._prefill_head, device, use_graphs=use_graphs, name="whisper prefill",
                                        capture_on_reuse=True, warm_up_new_shapes=False)
        self.loop_rung = loop_rung(self.device, use_graphs, self.steps_per_replay, guarded=self.decode_loop == "device")
        self._beam = None
        self._snapshot_buffers = None  # pinned host copies of the rows collect reads (CUDA)
        self._smaller_bucket_needs: Dict[tuple, int] = {}  # how often a run could have used a smaller bucket
        self._masks: Dict[str, Tuple[int, ...]] = {}  # the token ids each suppression mask holds now
        self._index_every_head = False  # launch_once: a lone eager head indexed as a graph's inputs are
        self.seed(0)

    @property
    def beam(self) -> BeamSearch:
        """The beam search over this decoder's state (its own buffers are allocated on first use)."""
        if self._beam is None:
            self._beam = BeamSearch(self)
        return self._beam

    def seed(self, seed: Optional[int]) -> None:
        """Seed sampling and restart the call count; None picks a fresh random seed.

        The n-th ``decode`` call after ``seed(s)`` samples with ``window_seed(s, n)`` (unless a
        request brings its own ``rng_seed``), so a seed gives the same tokens run after run.
        """
        self._seed = random.getrandbits(64) if seed is None else int(seed)
        self._calls = 0

    def continue_from(self, other: "WindowDecoder") -> None:
        """Take over another decoder's seed and call count (when the state is regrown mid-audio)."""
        self._seed, self._calls = other._seed, other._calls

    def next_window_seed(self) -> int:
        """The seed of the next decode call's windows (and count the call)."""
        seed = window_seed(self._seed, self._calls)
        self._calls += 1
        return seed

    def nbytes(self) -> int:
        """Device bytes of every persistent decode buffer (beam search's included once allocated)."""
        return self.state.nbytes()

    # -- state ---------------------------------------------------------------------------------
    def _allocate_state(self) -> DeviceState:
        dims = self.model.dims
        dtype = self.model.decoder.token_embedding.weight.dtype
        head_dim = dims.n_text_state // dims.n_text_head
        rows, layers = self.max_rows, dims.n_text_layer
        st = DeviceState(self.device)
        st.allocate("self_k", (layers, rows, dims.n_text_head, dims.n_text_ctx, head_dim), dtype)
        st.allocate("self_v", (layers, rows, dims.n_text_head, dims.n_text_ctx, head_dim), dtype)
        st.allocate("cross_k", (layers, self.windows, dims.n_text_head, dims.n_audio_ctx, head_dim), dtype)
        st.allocate("cross_v", (layers, self.windows, dims.n_text_head, dims.n_audio_ctx, head_dim), dtype)
        i64, f32, b = torch.int64, torch.float32, torch.bool
        st.allocate("token", (rows,), i64)  # the token each row feeds in next
        st.allocate("position", (rows,), i64)
        st.allocate("n_generated", (rows,), i64)
        st.allocate("max_new", (rows,), i64)
        st.allocate("last", (rows,), i64, -1)
        st.allocate("penultimate", (rows,), i64, -1)
        st.allocate("last_timestamp", (rows,), i64, -1)
        st.allocate("done", (rows,), b, True)
        st.allocate("sum_logprob", (rows,), f32)
        st.allocate("no_speech", (rows,), f32)
        st.allocate("no_speech_at_step", (rows,), b)
        st.allocate("timestamps", (rows,), b)
        st.allocate("max_initial_timestamp", (rows,), i64)
        st.allocate("out_tokens", (rows, dims.n_text_ctx), i64, self.tokenizer.eot)
        st.allocate("sample_begin", (rows,), i64)  # forced prefix length: the first free step
        st.allocate("prefix_tokens", (rows, dims.n_text_ctx), i64, self.tokenizer.eot)
        st.allocate("seen", (rows, dims.n_vocab), b)  # tokens generated so far (repetition penalty)
        st.allocate("suppress", (dims.n_vocab,), b)
        st.allocate("suppress_at_begin", (dims.n_vocab,), b)
        st.allocate("temperature", (1,), f32, 1.0)
        st.allocate("repetition_penalty", (1,), f32, 1.0)
        st.allocate("rng_key", (rows,), i64)  # each row's sampling seed (32 bits)
        st.allocate("finished_at_entry", (1,), i64)  # rows done when the device loop was entered
        token_hash = st.allocate("token_hash", (dims.n_vocab,), i64)
        # In numpy: the same integers; a process's first torch xor, shift and and on the host took
        # ~50 ms under the profiler (H100 machine), which a first transcribe_batch paid for its decoder.
        token_hash.copy_(torch.from_numpy(mix32(np.arange(dims.n_vocab, dtype=np.int64))))
        return st

    # Per-row buffers (rows on dim 0) and the self-attention caches (rows on dim 1).
    ROW_BUFFERS = (
        "token", "position", "n_generated", "max_new", "last", "penultimate", "last_timestamp", "done",
        "sum_logprob", "no_speech", "no_speech_at_step", "timestamps", "max_initial_timestamp",
        "out_tokens", "sample_begin", "prefix_tokens", "seen", "rng_key",
    )

    def _layer_views(self, name: str, rows: int) -> List[Tensor]:
        buf = self.state[name]
        return [buf[i, :rows] for i in range(buf.shape[0])]

    def reset_rows(self) -> None:
        """Put every row in a valid, finished state (safe to run the step on: capture warm-up)."""
        st = self.state
        for name in ("position", "n_generated", "max_new", "sum_logprob", "no_speech", "max_initial_timestamp"):
            st[name].zero_()
        st["token"].fill_(self.tokenizer.eot)
        for name in ("last", "penultimate", "last_timestamp"):
            st[name].fill_(-1)
        st["done"].fill_(True)
        for name in ("no_speech_at_step", "timestamps", "sample_begin", "seen"):
            st[name].zero_()

    # -- the step ------------------------------------------------------------------------------
    def _loop_guard(self, key: GreedyKey, entering: bool) -> Tensor:
        """Whether the device loop runs K more steps: not once a row has finished since the loop was
        entered (its window can be collected and the row refilled), nor when no row is active."""
        rows = key.rows
        finished = self.state["done"][:rows].sum()
        mark = self.state["finished_at_entry"]
        if entering:
            mark.copy_(finished)
            return finished < rows
        return finished == mark

    def _step(self, key: GreedyKey) -> None:
        rows, sample, penalize, ngram, group = key
        st = self.state
        filled = None
        if st["position"].device.type == "cpu":
            # Eager on the CPU, where reading the rows' positions is free: self-attention over the
            # written positions only, not the whole context (0.3-1 ms of a tiny.en step early on).
            filled = int(st["position"][:rows].max()) + 1
        fused = self._fused_rules and not sample
        # the fused rules read half-precision logits themselves; the penalty's multiply wants float32
        logits = self.run_decoder(rows, filled=filled, group=group, float_logits=not fused or penalize)
        if fused:
            # Rules, log-softmax, argmax, the no-speech probability and everything below in one kernel.
            rows_state = {name: st[name][:rows] for name in self._ADVANCED}
            rows_state["seen"] = st["seen"][:rows] if penalize else None
            rules_kernel.fused_greedy_step(
                self._penalized(logits, rows, penalize), self.layout, *self._rule_state(rows, ngram),
                no_speech=self.tokenizer.no_speech, rows_state=rows_state,
            )
            return
        self.record_no_speech(logits, rows)
        logprobs = self.logprobs(logits, rows, penalize, ngram)
        if sample:
            # Gumbel-max: argmax(log p / T + G) is a draw from softmax(log p / T).
            uniform = self._uniform_noise(rows)
            next_token = (logprobs / st["temperature"] - torch.log(-torch.log(uniform))).argmax(dim=-1)
        else:
            next_token = logprobs.argmax(dim=-1)
        logprob = logprobs.gather(1, next_token[:, None])[:, 0]

        # Forced prefix steps take the prefix token and score nothing (CTranslate2 resets the score).
        n_gen = st["n_generated"][:rows]
        forced = n_gen < st["sample_begin"][:rows]
        cursor = n_gen.clamp(max=st["prefix_tokens"].shape[1] - 1)[:, None]
        next_token = torch.where(forced, st["prefix_tokens"][:rows].gather(1, cursor)[:, 0], next_token)
        logprob = torch.where(forced, torch.zeros_like(logprob), logprob)

        active = ~st["done"][:rows]
        eot = self.tokenizer.eot
        next_token = torch.where(active, next_token, torch.full_like(next_token, eot))
        st["sum_logprob"][:rows].add_(torch.where(active, logprob, torch.zeros_like(logprob)))
        self.append_tokens(rows, next_token, active, penalize)
        done = st["done"][:rows]
        done.copy_(done | (next_token == eot) | (n_gen >= st["max_new"][:rows]))

    # The per-row buffers the fused greedy step updates besides the rule state.
    _ADVANCED = ("token", "position", "max_new", "done", "sum_logprob", "no_speech", "no_speech_at_step",
                 "out_tokens", "prefix_tokens")

    def _uniform_noise(self, rows: int) -> Tensor:
        """[rows, V] uniform numbers in (0, 1): a hash of (row seed, row step, token id)."""
        st = self.state
        step_key = mix32(st["rng_key"][:rows] ^ mix32(st["n_generated"][:rows] & MASK32))
        bits = mix32(step_key[:, None] ^ st["token_hash"][None, :])
        # 23 bits: (k + 0.5) / 2**23 is exact in float32 and strictly inside (0, 1), so the Gumbel
        # noise -log(-log(u)) is always finite (24 bits would round the top value up to 1.0).
        return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))

    def run_decoder(self, rows: int, filled: Optional[int] = None, group: int = 1, float_logits: bool = True) -> Tensor:
        """One decoder step on each row's current token: float32 logits [rows, n_vocab] (with
        ``float_logits=False`` in the model's dtype). ``filled``: a bound on every row's position;
        ``group``: rows in groups of this size hold one window, whose cross-attention K/V is slot
        ``row // group``."""
        st = self.state
        return self.model.decoder(
            st["token"][:rows, None],
            st["position"][:rows, None],
            self._layer_views("self_k", rows),
            self._layer_views("self_v", rows),
            self._layer_views("cross_k", rows // group),
            self._layer_views("cross_v", rows // group),
            filled=filled,
            cross_group=group,
            float_logits=float_logits,
        )[:, 0]

    def record_no_speech(self, logits: Tensor, rows: int) -> None:
        # The no-speech probability is read off the raw logits at the <|startoftranscript|> step.
        st = self.state
        take = st["no_speech_at_step"][:rows] & (st["n_generated"][:rows] == 0) & ~st["done"][:rows]
        if logits.device.type == "cpu" and not bool(take.any()):
            return  # eager on the CPU, so it may ask: a log-sum-exp over the vocabulary saved per step
        no_speech = torch.exp(logits[:, self.tokenizer.no_speech] - torch.logsumexp(logits, dim=-1))
        st["no_speech"][:rows].copy_(torch.where(take, no_speech, st["no_speech"][:rows]))

    def _penalized(self, logits: Tensor, rows: int, penalize: bool) -> Tensor:
        if not penalize:
            return logits
        st = self.state
        p = st["repetition_penalty"]
        penalized = torch.where(logits < 0, logits * p, logits / p)
        return torch.where(st["seen"][:rows], penalized, logits)

    def _rule_state(self, rows: int, ngram: int) -> tuple:
        """apply_logit_rules' arguments after the logits, for the first ``rows`` rows."""
        st = self.state
        return (
            st["suppress"], st["suppress_at_begin"], st["timestamps"][:rows], st["max_initial_timestamp"][:rows],
            st["n_generated"][:rows], st["last"][:rows], st["penultimate"][:rows], st["last_timestamp"][:rows],
            st["sample_begin"][:rows], self._repeated_ngrams(rows, ngram) if ngram > 0 else None,
        )

    def _filter_logits(self, logits: Tensor, rows: int, penalize: bool, ngram: int) -> Tensor:
        """The logits with CTranslate2's processors applied, in its order: repetition penalty,
        repeated n-grams, suppressed tokens, suppression at the first free step, timestamp rules."""
        return apply_logit_rules(self._penalized(logits, rows, penalize), self.layout, *self._rule_state(rows, ngram))

    def logprobs(self, logits: Tensor, rows: int, penalize: bool, ngram: int) -> Tensor:
        """log_softmax of the filtered logits (one fused kernel where available)."""
        if self._fused_rules:
            return rules_kernel.fused_filtered_log_softmax(
                self._penalized(logits, rows, penalize), self.layout, *self._rule_state(rows, ngram)
            )
        return torch.log_softmax(self._filter_logits(logits, rows, penalize, ngram), dim=-1)

    def _repeated_ngrams(self, rows: int, n: int) -> Tensor:
        """[rows, V] bool: tokens that would repeat an n-gram of the row's tokens so far."""
        st = self.state
        seq = st["out_tokens"][:rows]
        length = st["n_generated"][:rows]
        starts = seq.shape[1] - n + 1
        # An earlier occurrence of the last n-1 tokens at p, followed by a token: ban that token.
        match = torch.arange(starts, device=seq.device)[None, :] <= (length - n)[:, None]
        for j in range(n - 1):
            current = seq.gather(1, (length - n + 1 + j).clamp(min=0)[:, None])
            match = match & (seq[:, j : j + starts] == current)
        following = seq[:, n - 1 : n - 1 + starts]
        counts = torch.zeros(rows, self.model.dims.n_vocab, dtype=torch.int32, device=seq.device)
        return counts.scatter_add_(1, following, match.to(torch.int32)) > 0

    def append_tokens(self, rows: int, next_token: Tensor, active: Tensor, penalize: bool) -> None:
        """Record each active row's next token and move the row on by one position."""
        st = self.state
        n_gen = st["n_generated"][:rows]
        last, penult, last_ts = st["last"][:rows], st["penultimate"][:rows], st["last_timestamp"][:rows]
        # Record the token at each active row's write cursor (done rows rewrite what is there).
        out = st["out_tokens"][:rows]
        cursor = n_gen.clamp(max=out.shape[1] - 1)[:, None]
        out.scatter_(1, cursor, torch.where(active[:, None], next_token[:, None], out.gather(1, cursor)))
        # Timestamp rules look back only over freely chosen tokens.
        free = n_gen >= st["sample_begin"][:rows]
        is_ts = next_token >= self.layout.timestamp_begin
        last_ts.copy_(torch.where(active & free & is_ts, next_token, last_ts))
        penult.copy_(torch.where(active, last, penult))
        last.copy_(torch.where(active, next_token, last))
        if penalize:
            seen = st["seen"][:rows]
            index = next_token[:, None]
            seen.scatter_(1, index, active[:, None] | seen.gather(1, index))
        n_gen.add_(active.long())
        # Never past the context's last position: a window may end on it, and its finished row is
        # still stepped (the rest of a K-step replay) with its cache position read and written.
        st["position"][:rows].add_(active.long()).clamp_(max=out.shape[1] - 1)
        token = st["token"][:rows]
        token.copy_(torch.where(active, next_token, token))

    # -- runs: windows admitted into free rows -------------------------------------------------
    def start(
        self,
        options: SearchOptions,
        suppress_tokens: Sequence[int],
        suppress_at_begin: Sequence[int],
        windows: int,
        batch_prefix: bool = False,
    ):
        """A run of up to ``windows`` concurrent windows with these options (captures its graphs).

        ``batch_prefix`` (beam search): as CTranslate2 does for one batch, a forced prefix in any
        window admitted together switches the prefix handling on for all of them."""
        if options.beam_size > 1:
            if options.sampling:
                raise ValueError("beam search does not sample: use temperature 0 with beam_size > 1")
            return self.beam.start(options, suppress_tokens, suppress_at_begin, windows, batch_prefix)
        return GreedyRun(self, options, suppress_tokens, suppress_at_begin, windows)

    def decode(
        self,
        audio_features: Tensor,
        requests: Sequence[WindowRequest],
        suppress_tokens: Sequence[int],
        suppress_at_begin: Sequence[int],
        options: Optional[SearchOptions] = None,
    ) -> List[WindowResult]:
        """Decode one window per request; ``audio_features`` is the encoder output [B, n_audio_ctx, d]."""
        options = options or SearchOptions()
        n = len(requests)
        if audio_features.shape[0] != n:
            raise ValueError(f"{audio_features.shape[0]} windows of audio but {n} requests")
        seed = self.next_window_seed()
        requests = [r if r.rng_seed is not None else with_seed(r, seed ^ i) for i, r in enumerate(requests)]
        scheduler = RowScheduler(lambda _: self.start(options, suppress_tokens, suppress_at_begin, n, batch_prefix=True))
        results: List[Optional[WindowResult]] = [None] * n
        for i, job in enumerate(window_jobs(audio_features, requests)):
            scheduler.submit(options, job, store_at(results, i))
        scheduler.run_until_idle()
        return results  # type: ignore[return-value]

    def launch_once(self, audio_features: Tensor, prompt: Sequence[int]) -> None:
        """Decode one window of ``audio_features`` [1, n_audio_ctx, d] for two steps after a previous
        text's head and ``prompt`` (a start-of-transcript sequence), and look at the loop guard; then
        leave the rows reset: the kernels a first decode launches load here (a model's load runs this
        on a helper thread, on an eager decoder of its own). The head is prefilled as a prefill graph's
        first, eager, call runs it (rows and slots as device tensors). CUDA loads each of PyTorch's
        kernel families at its first launch, 5-70 ms apiece under the profiler (a first batch-16
        call's first prefill: 59 ms in its positions' arange); on an H100 loading every kernel at
        start-up took ~0.1 s off a first batch-16 call."""
        tok = self.tokenizer
        head = [tok.sot_prev] + [tok.encode(" ")[0]] * PREFILL_GRAPH_TOKENS  # longer than a short head
        request = WindowRequest(prompt=head + list(prompt), timestamps=True, max_initial_timestamp_index=50,
                                max_new_tokens=2)
        self._index_every_head = True
        try:  # the rules a transcription's defaults set (suppress_tokens=[-1], suppress_blank)
            self.decode(audio_features, [request], tok.suppressed_tokens([-1]), [tok.encode(" ")[0], tok.eot])
        finally:
            self._index_every_head = False
        key = GreedyKey(rows=1)
        self._loop_guard(key, True)
        self._loop_guard(key, False)
        self.reset_rows()

    def mark_path_warm(self) -> None:
        """This model's greedy decode path has run on the device, on a decoder of the load's own
        (``launch_once``): a window's K/V write, prompt heads' prefill and the greedy step and guard.
        Their kernels are loaded and their lazily made buffers exist, so this decoder's first
        captures of those (a run's bucket, a prefill key) run no warm-up. (Not sampling's.)"""
        for graph in (self.graph, self._cross_graph, self._prefill_graph):
            graph.mark_warm()

    def rows_for(self, windows: int, options: SearchOptions) -> int:
        """Decoder rows a call of ``windows`` windows with ``options`` occupies."""
        if options.sampling:
            return windows * max(1, options.num_hypotheses)
        return windows * max(1, options.beam_size)

    def wants_smaller_bucket(self, key) -> bool:
        """Whether a run that could step fewer rows now should capture ``key`` (a smaller bucket than
        its own) at once: at the second time it could. A bucket met once (the last few windows of
        one batch) is not worth a capture's wait in that call (tens of ms, warm-up included): the
        run's larger graph steps those rows meanwhile, and the bucket's capture is deferred to spare
        time (``GreedyRun.admit``)."""
        needs = self._smaller_bucket_needs[key] = self._smaller_bucket_needs.get(key, 0) + 1
        return needs >= 2

    def capture_deferred(self, within: Optional[float] = None) -> bool:
        """Capture one graph deferred to spare time (a prefill key met once, a smaller bucket a run
        could use); returns whether there was one. A capture runs nothing, so a run does this while
        its advance is on the device (``use_spare_time``); ``within``: the device time that advance
        has left, which a capture that takes longer would not hide behind (StepGraph.capture_deferred)."""
        graphs = (self.graph, self.sample_graph, self._prefill_graph, self._cross_graph)
        return any(graph.capture_deferred(within) for graph in graphs)

    def capture_graph(self, graph: StepGraph, key) -> None:
        """Capture ``key``'s graph first if it has none yet: capture runs the step on a reset state."""
        if graph.use_graphs and not graph.is_captured(key):
            self.reset_rows()
            if self._beam is not None:
                self._beam.reset()
            graph.capture(key)

    def set_rules(self, suppress_tokens: Sequence[int], suppress_at_begin: Sequence[int], options: SearchOptions) -> None:
        """The state every row of a run shares: suppression masks, temperature, repetition penalty."""
        st = self.state
        self._set_mask("suppress", suppress_tokens)
        self._set_mask("suppress_at_begin", suppress_at_begin)
        st["temperature"].fill_(options.temperature if options.sampling else 1.0)
        st["repetition_penalty"].fill_(options.repetition_penalty)

    def admit_rows(self, slots: Sequence[int], per: int, jobs: Sequence[WindowJob]) -> None:
        """Load window i into slot slots[i]: rows slots[i] * per .. slots[i] * per + per - 1 (beams or
        samples), which a step reads as one group (``run_decoder(group=per)``) on the slot's
        cross-attention K/V."""
        st = self.state
        audio_features = concat_rows([j.audio_features for j in jobs])  # a view when they were one batch
        requests = [j.request for j in jobs]
        first_rows = [slot * per for slot in slots]
        # Values go up through pinned memory: a pageable copy would wait for the rows' running steps.
        index = host_values_to_device(list(slots), self.device)
        for w in range(len(jobs)):  # one window at a time: its values do not depend on the others
            self._cross_graph(CrossKey(), features=audio_features[w : w + 1], index=index[w : w + 1])
        written = self._prefill(first_rows, slots, requests)
        for first, req, filled in zip(first_rows, requests, written):
            window = req.rng_seed if req.rng_seed is not None else 0
            keys = host_values_to_device([row_seed(window, j) for j in range(per)], self.device)
            st["rng_key"][first : first + per].copy_(keys)
            if per > 1:
                self.copy_row(first, range(first + 1, first + per), filled)

    def snapshot_rows(self, rows: int) -> "RowSnapshot":
        """What ``collect`` reads of the first ``rows`` rows (done flags, tokens, scores), as the work
        queued so far leaves them. On CUDA the copies go to pinned host memory behind that work
        without waiting for it, so a caller may queue more (the next windows' prefill) before it
        reads them; on the CPU they are copied now."""
        names = ("done", "n_generated", "out_tokens", "sum_logprob", "no_speech")
        st = self.state
        if self.device.type != "cuda":
            return RowSnapshot({name: st[name][:rows].clone() for name in names}, None)
        if self._snapshot_buffers is None:
            self._snapshot_buffers = {name: torch.empty_like(st[name], device="cpu").pin_memory() for name in names}
        host = {name: self._snapshot_buffers[name][:rows] for name in names}
        for name in names:
            host[name].copy_(st[name][:rows], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return RowSnapshot(host, event)

    def copy_row(self, source: int, targets: Sequence[int], filled: int) -> None:
        """Copy row ``source``'s state into ``targets``, and the first ``filled`` positions of its
        self-attention caches: the later ones are never read before a step writes them (the whole
        row of large-v3's caches is 37 MB a copy; a prompt head is a few positions)."""
        st = self.state
        index = host_values_to_device(list(targets), self.device)
        for name in self.ROW_BUFFERS:
            buf = st[name]
            row = buf[source : source + 1].clone()  # a copy: source and targets share the buffer
            buf.index_copy_(0, index, row.expand(len(index), *buf.shape[1:]))
        if not filled:
            return
        for name in ("self_k", "self_v"):
            buf = st[name][:, :, :, :filled]
            row = buf[:, source : source + 1].clone()
            buf.index_copy_(1, index, row.expand(-1, len(index), *buf.shape[2:]))

    def _set_mask(self, name: str, ids: Sequence[int]) -> None:
        """Write the mask of ``ids`` unless it holds them already: calls nearly always suppress the same
        tokens, and building and uploading a vocabulary-sized mask (from pageable memory: a copy that
        waits for the device) cost a tiny.en decode call of 16 windows 2.4 ms of its 25 (H100)."""
        key = tuple(sorted(set(int(i) for i in ids)))
        if self._masks.get(name) == key:
            return
        mask = torch.zeros(self.model.dims.n_vocab, dtype=torch.bool)
        if key:
            mask[torch.tensor(key, dtype=torch.long)] = True
        self.state[name].copy_(mask)
        self._masks[name] = key

    def _write_cross(self, key: CrossKey, features: Tensor, index: Tensor) -> None:
        """Project one window's cross-attention K/V ([1, n_audio_ctx, d] features) into slot ``index``."""
        st = self.state
        layers = range(st["cross_k"].shape[0])
        self.model.decoder.write_cross_kv(
            features, [st["cross_k"][i] for i in layers], [st["cross_v"][i] for i in layers], index
        )

    def _prefill_head(self, key: PrefillKey, tokens: Tensor, positions: Tensor, rows, slots,
                      logits_at: Optional[Tensor] = None) -> Tensor:
        """The decoder over prompt heads [W, L] into ``rows``' self-attention caches, each on its
        ``slots`` entry's cross-attention K/V: the float32 logits [W, 1, n_vocab] of position
        ``key.logits_at``, or (``PER_WINDOW``) of each window's position in ``logits_at`` [W] (the
        vocabulary product of every position would cost more than the rest of a long prompt's prefill).

        ``rows`` and ``slots`` are ints (one window), or int64 tensors [W] on the device (a graph's
        inputs: one capture serves every row). The heads' keys and values go to a scratch cache of L
        positions, then into the rows': attention reads those L keys, not the whole context."""
        st = self.state
        windows, length = tokens.shape
        layers, _, heads, _, head_dim = st["self_k"].shape
        scratch_k = st["self_k"].new_empty((layers, windows, heads, length, head_dim))
        scratch_v = torch.empty_like(scratch_k)
        if isinstance(slots, Tensor):  # every slot's K/V, the slots read on the device
            cross_k, cross_v, cross_rows = list(st["cross_k"]), list(st["cross_v"]), slots
        else:
            window = slice(slots, slots + 1)
            cross_k, cross_v, cross_rows = list(st["cross_k"][:, window]), list(st["cross_v"][:, window]), None
        logits = self.model.decoder(
            tokens, positions, list(scratch_k), list(scratch_v), cross_k, cross_v,
            filled=length, cross_rows=cross_rows, logits_at=logits_at if key.logits_at == PER_WINDOW else key.logits_at,
        )
        for name, scratch in (("self_k", scratch_k), ("self_v", scratch_v)):
            cache = st[name][:, :, :, :length]
            if isinstance(rows, Tensor):
                cache.index_copy_(1, rows, scratch)
            else:  # eager: a view of the row, no index tensor to build on the host and copy over
                cache[:, rows : rows + 1].copy_(scratch)
        return logits

    def _prefill_heads(self, heads: List[List[int]], rows: List[int], slots: List[int],
                       logits_at: Union[int, List[int]]) -> Tensor:
        """Prompt heads into their rows' caches, in one call: float32 logits [W, n_vocab] of position
        ``logits_at`` (heads of one length), or of each head's own position (a list: heads of any
        length up to LONG_HEAD_TOKENS, padded to it)."""
        windows = len(heads)
        padded = isinstance(logits_at, list)
        length = LONG_HEAD_TOKENS if padded else len(heads[0])
        key = PrefillKey(windows, length, PER_WINDOW if padded else logits_at)
        if padded:  # any token will do after a head: its positions are written again before they are read
            heads = [list(head) + [self.tokenizer.eot] * (length - len(head)) for head in heads]
        tokens = host_values_to_device(heads, self.device)
        positions = torch.arange(length, device=self.device).repeat(windows, 1)
        at = host_values_to_device(logits_at, self.device) if padded else None
        graphed = (length <= PREFILL_GRAPH_TOKENS or padded) and self._prefill_graph.use_graphs
        if windows == 1 and not graphed and not self._index_every_head:  # eager: views of the row and slot
            logits = self._prefill_head(key, tokens, positions, rows[0], slots[0], at)
        else:
            where = host_values_to_device(rows + slots, self.device)  # inputs: one capture serves every row
            run = self._prefill_graph if graphed else self._prefill_head
            inputs = dict(tokens=tokens, positions=positions, rows=where[:windows], slots=where[windows:])
            if padded:
                inputs["logits_at"] = at
            logits = run(key, **inputs)
        return logits[:, 0]

    # A row's loop state as admission sets it: (buffer, value of the row's plan and request).
    _ROW_INTS = (
        ("token", lambda plan, req: plan.start),
        ("position", lambda plan, req: plan.length - 1),
        ("n_generated", lambda plan, req: 0),
        ("max_new", lambda plan, req: req.max_new_tokens),
        ("timestamps", lambda plan, req: int(req.timestamps)),
        ("max_initial_timestamp", lambda plan, req: req.max_initial_timestamp_index),
        ("last", lambda plan, req: -1),
        ("penultimate", lambda plan, req: -1),
        ("last_timestamp", lambda plan, req: -1),
        ("sample_begin", lambda plan, req: len(plan.prefix)),
        ("no_speech_at_step", lambda plan, req: int(plan.sot_index == plan.length - 1)),
        ("done", lambda plan, req: 0),
    )

    def _set_rows(self, rows: Sequence[int], requests: Sequence[WindowRequest], plans: List[_PromptPlan],
                  no_speech: Dict[int, Tensor]) -> None:
        """Every admitted row's loop state in a few launches from one upload. Writing a Python number
        into one element of a CUDA tensor copies it from pageable memory, which waits for all queued
        work (the rows' running steps): none is written that way here."""
        st = self.state
        values = [[get(plan, req) for plan, req in zip(plans, requests)] for _, get in self._ROW_INTS]
        longest = max(len(plan.prefix) for plan in plans)
        prefixes = [list(plan.prefix) + [self.tokenizer.eot] * (longest - len(plan.prefix)) for plan in plans]
        upload = host_values_to_device([list(rows)] + values, self.device)
        index, columns = upload[0], upload[1:]
        for (name, _), column in zip(self._ROW_INTS, columns):
            st[name].index_copy_(0, index, column.to(st[name].dtype))
        st["sum_logprob"].index_fill_(0, index, 0.0)
        st["seen"].index_fill_(0, index, False)
        if no_speech:  # read at the prompt head's start-of-transcript position; the others' at their first step
            kept = [no_speech[i] if i in no_speech else st["no_speech"][row] for i, row in enumerate(rows)]
            st["no_speech"].index_copy_(0, index, torch.stack(kept))
        if longest:
            prefix = host_values_to_device(prefixes, self.device)
            st["prefix_tokens"][:, :longest].index_copy_(0, index, prefix)

    def _prefill(self, rows: Sequence[int], slots: Sequence[int], requests: Sequence[WindowRequest]) -> List[int]:
        """Run each prompt's context into its row's KV cache (on its window's cross-attention slot);
        set the rows' loop state. Returns the cache positions written in each row.

        As CTranslate2: the context is the prompt before the last token of the start-of-transcript
        sequence; decoding starts from that token, and the prompt's remaining tokens are forced.
        Heads of one length (and start-of-transcript position) prefill together (``prefill_groups``).
        """
        tok = self.tokenizer
        plans = []
        for req in requests:
            prompt = list(req.prompt)
            sot_index = prompt.index(tok.sot)
            length = prompt_length(prompt, tok.sot, tok.no_timestamps)
            head, start, prefix = prompt[: length - 1], prompt[length - 1], prompt[length:]
            if len(head) + max(req.max_new_tokens, len(prefix) + 1) > self.model.dims.n_text_ctx:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens and {req.max_new_tokens} steps do not fit the text context"
                )
            plans.append(_PromptPlan(sot_index, length, head, start, prefix))
        alike: Dict[Tuple[int, int], List[int]] = {}
        for i, plan in enumerate(plans):
            if plan.head:
                n = len(plan.head)
                padded = self._pad_long_heads and PREFILL_GRAPH_TOKENS < n <= LONG_HEAD_TOKENS
                alike.setdefault((LONG_HEAD_TOKENS, PER_WINDOW) if padded else (n, min(plan.sot_index, n - 1)),
                                 []).append(i)
        no_speech: Dict[int, Tensor] = {}
        for (_, logits_at), members in alike.items():
            for size in prefill_groups(len(members), self._prefill_together):
                group, members = members[:size], members[size:]
                at = [min(plans[i].sot_index, len(plans[i].head) - 1) for i in group]
                logits = self._prefill_heads([plans[i].head for i in group], [rows[i] for i in group],
                                             [slots[i] for i in group], at if logits_at == PER_WINDOW else logits_at)
                for i, row_logits in zip(group, logits):  # read now: a graph's output is overwritten by its next replay
                    no_speech[i] = torch.softmax(row_logits, dim=-1)[tok.no_speech]  # the logits at sot_index
        self._set_rows(rows, requests, plans, no_speech)
        return [len(plan.head) for plan in plans]


class RowSnapshot:
    """Host copies of the rows' results at one point of the device's work (``snapshot_rows``)."""

    def __init__(self, host: Dict[str, Tensor], event):
        self._host, self._event = host, event

    @property
    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def read(self) -> Dict[str, Tensor]:
        if self._event is not None:
            self._event.synchronize()
        return self._host


class GreedyRun(SlotTable):
    """Greedy or sampled decoding of windows admitted into free row groups of one run.

    Each window takes ``per`` rows (``best_of`` samples, else one); all rows step together in one
    graph per run; a window is finished when its rows are, and its rows go back to the free pool.
    """

    def __init__(self, decoder: WindowDecoder, options: SearchOptions, suppress, suppress_at_begin, windows: int):
        self.decoder, self.options = decoder, options
        self.per = max(1, options.num_hypotheses) if options.sampling else 1
        penalize = options.repetition_penalty != 1.0
        ngram = int(options.no_repeat_ngram_size)
        if self.per == 1 and not (options.sampling or penalize or ngram):
            rows = bucket_for(windows, decoder.buckets)
            # An advance replays the smallest of these graphs that holds the busy windows, once it is
            # captured (see admit): one audio alone on an engine of 16 rows steps one row, not 16.
            self._buckets = tuple(b for b in decoder.buckets if b <= rows)
        else:
            rows = windows * self.per
            if rows > decoder.max_rows:
                raise ValueError(
                    f"{windows} windows x {self.per} samples need {rows} rows; the decoder holds {decoder.max_rows}"
                )
            self._buckets = (rows,)
        if rows // self.per > decoder.windows:
            raise ValueError(f"{windows} windows at once; the decoder holds {decoder.windows}")
        self.key = GreedyKey(rows, options.sampling, penalize, ngram, self.per)
        self.graph = decoder.sample_graph if options.sampling else decoder.graph
        self.windows = windows
        decoder.capture_graph(self.graph, self.key)
        decoder.reset_rows()
        decoder.set_rules(suppress, suppress_at_begin, options)
        self.rows = rows
        super().__init__(windows)  # busy slot -> its first row
        self._stepped: set = set()  # the slots the last advance stepped: all collect may report
        self._snapshot: Optional[RowSnapshot] = None  # the rows as the advance not yet collected leaves them
        self.clock = AdvanceClock(decoder.device)  # how long advances keep the device busy (spare time)

    # Admission only queues device work behind a running advance, and collect reads the snapshot
    # that advance queued: a window can be loaded while the rows step (see admit).
    admits_while_advancing = True

    @property
    def ready(self) -> bool:
        """Whether the last advance's results can be read without waiting for the device."""
        return self._snapshot is None or self._snapshot.ready

    def admit(self, jobs: Sequence[WindowJob]) -> List[int]:
        """Load windows into free slots; returns their slot numbers. Also while an advance runs: the
        prefill is queued behind it, and the slots are not the last advance's to report."""
        if self.graph.use_graphs and not self.busy and self._snapshot is None:
            # No row is in use and no advance in flight: a smaller bucket's graph can be captured now
            # (capture resets the rows), so that these windows step only their own rows.
            need = self.key._replace(rows=next(b for b in self._buckets if b >= len(jobs)))
            if not self.graph.is_captured(need):
                if self.decoder.wants_smaller_bucket(need):
                    self.decoder.capture_graph(self.graph, need)
                else:
                    # Its capture can come in spare time, while these windows step in the run's graph
                    # (a capture without a warm-up; if that fails, at the bucket's next need). The
                    # load decoded a window at one row (launch_once): that key's step has run.
                    self.graph.defer(need, step_has_run=need.rows == 1)
        slots = self.take(len(jobs))
        self.decoder.admit_rows(slots, self.per, jobs)  # a window's samples read one cross-attention K/V
        for slot in slots:
            self.occupy(slot, slot * self.per)
            self._stepped.discard(slot)
        return slots

    def use_spare_time(self) -> bool:
        """(While an advance runs) capture a graph deferred to spare time, if the device stays busy
        for as long as that takes; returns whether it did."""
        return self.decoder.capture_deferred(within=self.clock.seconds_left())

    def advance(self, refill: bool = True) -> None:
        """Step the rows up to the last busy window (finished rows are masked): on the device loop
        until a row finishes (its window's audio needs the result for its next window, so whether
        others wait does not matter), else ``steps_per_replay`` steps. Without graphs exactly those
        rows step; with graphs the smallest captured bucket that holds them (a graph is captured
        per row count on a reset state: the run's own at its start, smaller ones in ``admit``)."""
        key = self.key
        if self.busy:
            extent = self.extent()
            if not self.graph.use_graphs:
                key = key._replace(rows=extent * self.per)
            else:
                key = next(k for k in (key._replace(rows=b) for b in self._buckets if b >= extent)
                           if self.graph.is_captured(k) or k == self.key)
        self.clock.launching(measure=not self.graph.may_capture(key))
        self.graph(key)
        self.clock.launched()
        self._stepped = set(self.slots())
        self._snapshot = self.decoder.snapshot_rows(self.rows)

    def stop_soon(self) -> None:
        """End the running advance at its next look at the guard: windows admitted meanwhile wait."""
        self.graph.stop_soon()

    def evict(self, slot: int) -> None:
        """Stop a window before it finished (its request was cancelled): its rows are free at once."""
        first = self[slot]
        self.decoder.state["done"][first : first + self.per].fill_(True)
        self.release(slot)

    def collect(self) -> Dict[int, WindowResult]:
        """Results of the windows the last advance finished; their slots become free."""
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return {}
        rows = snapshot.read()  # the one wait for the device per advance
        self.clock.collected()
        done = rows["done"].tolist()
        finished = [slot for slot, first in self.items()
                    if slot in self._stepped and all(done[first : first + self.per])]
        if not finished:
            return {}
        n_gen, sum_lp, no_speech = rows["n_generated"].tolist(), rows["sum_logprob"].tolist(), rows["no_speech"].tolist()
        eot = self.decoder.tokenizer.eot
        results = {}
        for slot in finished:
            first = self[slot]
            candidates = []
            for row in range(first, first + self.per):
                tokens = rows["out_tokens"][row, : n_gen[row]].tolist()
                while tokens and tokens[-1] == eot:
                    tokens.pop()
                score = normalized_score(sum_lp[row], len(tokens), self.options.length_penalty)
                candidates.append(WindowResult(tokens, sum_lp[row], no_speech[first], score))
            results[slot] = candidates[pick_best([c.score for c in candidates])]
            self.release(slot)
        return results
