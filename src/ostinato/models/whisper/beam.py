"""Beam search over a ``WindowDecoder``'s state, every step on the device and graph-safe.

The search is CTranslate2's (what faster-whisper runs), written as tensor ops over W windows of K
beams each (rows ``w * K + k`` of the decoder's state):

* Each step scores every beam's next tokens (the decoder's logit rules, then log-softmax) plus the
  beam's running score, and takes the 2K best (beam, token) candidates of each window. At the
  first step only beam 0 is expanded (all beams are copies of it).
* Of the first K candidates, those ending in end-of-text (after any forced prefix), or every one
  at the last allowed step, finish: the hypothesis (end-of-text dropped) is scored
  ``score / length ** length_penalty`` and kept if it is the window's best so far. A finished
  candidate's place goes to the next unused candidate of ranks K..2K-1 that is not end-of-text;
  when there is none, the finished candidate stays in the beam and decoding continues from it.
* A window stops at its last step, or once it has collected ``round(K * patience)`` finished
  hypotheses (with ``length_penalty == 0``: once its top beam finished).
* A forced prefix (prompt tokens after the start-of-transcript sequence) is fed one step at a
  time with beam 0 holding the prefix at score 0 and the others at -1e10; at the first free step
  end-of-text among the secondary candidates is replaced by token 0 at -1e10.

The surviving beams' histories move with them: the self-attention caches, generated tokens and
rule state are reordered by origin into the same buffers (on CUDA the caches by a kernel that
rewrites only the rows that move, ``ops.group_reorder``). Only the cache positions written so far
are moved. On the device loop (CUDA, the kernels present) one graph serves every length: it repeats
K steps until a window finishes, and the reorder kernel reads how far each window has got from the
rows' positions on the device. On the rungs below, the host knows that bound without asking the
device (prompt lengths plus steps taken), rounds it up to a bucket and replays that bucket's graph
of K steps. Finished hypotheses live in preallocated per-window buffers (only the best one is kept:
a call returns one hypothesis per window), and the host reads the windows' done flags once per
launch. A ``BeamRun`` admits windows into free beam groups while others are still searching.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ...ops import LazyModule
from ...ops.triton_support import kernels_can_run
from ...runtime import AdvanceClock, DeviceState, SlotTable, StepGraph
from .search import SearchOptions, WindowJob, WindowResult, normalized_score, prompt_length

KERNEL_MODULES = ("ostinato.ops.group_reorder",)  # Triton's, imported at first use (ops.LazyModule)
group_reorder = LazyModule(KERNEL_MODULES[0])

_PREFIX_SECONDARY_SCORE = -1e10  # CTranslate2's score for the beams that do not carry a forced prefix
CACHE_BUCKETS = (32, 64, 128, 256)  # cache lengths reordered per step (and the full context)


class BeamKey(NamedTuple):
    """A beam step graph: one per distinct value."""

    windows: int  # windows of the run (rows: windows x beams)
    beams: int  # K
    penalize: bool  # a repetition penalty is on
    ngram: int  # no_repeat_ngram_size (0: off)
    filled: int  # cache positions reordered per step: a bound on those written, rounded up to a bucket


def cache_bucket(filled: int, n_ctx: int) -> int:
    """The smallest bucket that covers ``filled`` cache positions."""
    for size in CACHE_BUCKETS:
        if filled <= size < n_ctx:
            return size
    return n_ctx


class _Prefixed:
    """The beam search's buffers, kept in the decoder's DeviceState under a name prefix."""

    def __init__(self, state: DeviceState, prefix: str):
        self._state, self._prefix = state, prefix

    def allocate(self, name, shape, dtype, fill=0) -> Tensor:
        return self._state.allocate(self._prefix + name, shape, dtype, fill)

    def __getitem__(self, name: str) -> Tensor:
        return self._state[self._prefix + name]

    def addresses(self):
        return {k: v for k, v in self._state.addresses().items() if k.startswith(self._prefix)}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for k in self._state if k.startswith(self._prefix)
                   for t in (self._state[k],))


class BeamSearch:
    """Beam search's own buffers and step over a ``WindowDecoder``'s state (passed in: the decoder
    owns the rows, the logit rules and the token bookkeeping this search reuses)."""

    def __init__(self, decoder):
        self.decoder = decoder
        windows = decoder.max_rows  # at most max_rows // 2 windows with K >= 2; a few bytes each
        ctx = decoder.model.dims.n_text_ctx
        i64, f32, b = torch.int64, torch.float32, torch.bool
        st = _Prefixed(decoder.state, "beam_")
        st.allocate("best_tokens", (windows, ctx), i64, decoder.tokenizer.eot)
        st.allocate("best_length", (windows,), i64)
        st.allocate("best_raw", (windows,), f32)  # the hypothesis' summed log-probability
        st.allocate("best_key", (windows,), f32)  # its normalised score (-inf mapped to the lowest float)
        st.allocate("has_best", (windows,), b)
        st.allocate("finished_count", (windows,), i64)
        st.allocate("top_finished", (windows,), b)
        st.allocate("max_candidates", (windows,), i64)
        st.allocate("early_exit", (windows,), b)
        st.allocate("has_prefix", (windows,), b)
        st.allocate("window_done", (windows,), b, True)
        st.allocate("length_penalty", (1,), f32, 1.0)
        st.allocate("finished_at_entry", (1,), i64)  # windows done when the device loop was entered
        self.state = st
        # The device loop needs the reorder bounded on the device (the host does not know how many
        # steps a launch ran): one graph, keyed by the full context, then serves every length.
        self.loops = decoder.decode_loop == "device" and kernels_can_run(decoder.device)
        loop = dict(loop_guard=self._loop_guard, max_loop_trips=ctx // decoder.steps_per_replay + 2) if self.loops else {}
        self.graph = StepGraph(
            self._step, decoder.device, use_graphs=decoder.graph.use_graphs, name="whisper beam step",
            steps_per_replay=decoder.steps_per_replay, **loop,
        )

    def reset(self) -> None:
        st = self.state
        for name in ("best_length", "finished_count", "max_candidates"):
            st[name].zero_()
        for name in ("has_best", "top_finished", "early_exit", "has_prefix"):
            st[name].zero_()
        st["window_done"].fill_(True)

    # -- the step ------------------------------------------------------------------------------
    def _loop_guard(self, key: BeamKey, entering: bool) -> Tensor:
        """Whether the device loop runs K more steps: not once a window has finished since the loop
        was entered (its result can be collected and its beams refilled), nor when none is searching."""
        finished = self.state["window_done"][: key.windows].sum()
        mark = self.state["finished_at_entry"]
        if entering:
            mark.copy_(finished)
            return finished < key.windows
        return finished == mark

    def _step(self, key: BeamKey) -> None:
        W, K, penalize, ngram, filled = key
        dec = self.decoder
        ds, bs = dec.state, self.state
        R, C = W * K, 2 * K
        V = dec.model.dims.n_vocab
        L = ds["out_tokens"].shape[1]
        eot = dec.tokenizer.eot
        device = ds["token"].device
        beam_ids = torch.arange(K, device=device)
        cand_ids = torch.arange(C, device=device)
        window_rows = torch.arange(W, device=device)[:, None] * K  # [W, 1]

        logits = dec.run_decoder(R, filled=filled, group=K)  # a window's beams share its audio
        dec.record_no_speech(logits, R)
        logprobs = dec.logprobs(logits, R, penalize, ngram)

        step = ds["n_generated"][:R].view(W, K)[:, 0]  # every beam of a window is at the same step
        prefix_length = ds["sample_begin"][:R].view(W, K)[:, 0]
        scores = ds["sum_logprob"][:R].view(W, K)
        # Step 0 expands beam 0 only.
        only_first = (step == 0)[:, None] & (beam_ids > 0)[None, :]
        scores = torch.where(only_first, torch.full_like(scores, float("-inf")), scores)
        total = logprobs.view(W, K, V) + scores[:, :, None]
        if device.type == "cpu":
            # each beam's best C, then the window's best C among them: the same candidates, and on two
            # cores a third of one top-k over K x V (0.8 ms a step at five beams of tiny.en)
            beam_score, beam_token = total.topk(C, dim=2)
            cand_score, pick = beam_score.view(W, K * C).topk(C, dim=1)
            flat = torch.div(pick, C, rounding_mode="floor") * V + beam_token.view(W, K * C).gather(1, pick)
        else:
            cand_score, flat = total.view(W, K * V).topk(C, dim=1)
        cand_beam = torch.div(flat, V, rounding_mode="floor")
        cand_token = flat - cand_beam * V

        # A forced prefix: every candidate is the prefix token, from beam 0.
        forced = (step < prefix_length)[:, None]
        cursor = step.clamp(max=L - 1)[:, None]
        prefix_token = ds["prefix_tokens"][:R].view(W, K, L)[:, 0].gather(1, cursor)  # [W, 1]
        secondary = torch.full_like(cand_score, _PREFIX_SECONDARY_SCORE)
        prefix_score = torch.where(cand_ids[None, :] == 0, torch.zeros_like(cand_score), secondary)
        cand_token = torch.where(forced, prefix_token.expand(W, C), cand_token)
        cand_score = torch.where(forced, prefix_score, cand_score)
        cand_beam = torch.where(forced, torch.zeros_like(cand_beam), cand_beam)
        # The first free step after a prefix keeps end-of-text out of the secondary candidates.
        replace = (
            (bs["has_prefix"][:W] & (step == prefix_length))[:, None]
            & (cand_ids[None, :] > 0)
            & (cand_token == eot)
        )
        cand_token = torch.where(replace, torch.zeros_like(cand_token), cand_token)
        cand_score = torch.where(replace, secondary, cand_score)
        cand_beam = torch.where(replace, torch.zeros_like(cand_beam), cand_beam)

        # Finished hypotheses among the first K candidates.
        alive = ~bs["window_done"][:W]
        last_step = step + 1 >= ds["max_new"][:R].view(W, K)[:, 0]
        top_token = cand_token[:, :K]
        top_eot = top_token == eot
        finished = (top_eot & (step >= prefix_length)[:, None]) | last_step[:, None]
        finished = finished & alive[:, None]
        # The m-th finished candidate hands its place to the m-th non-end-of-text secondary one.
        usable = cand_token[:, K:] != eot
        finished_rank = finished.long().cumsum(1) - 1
        usable_rank = usable.long().cumsum(1) - 1
        match = finished[:, :, None] & usable[:, None, :] & (finished_rank[:, :, None] == usable_rank[:, None, :])
        next_candidate = torch.where(match.any(-1), match.long().argmax(-1) + K, beam_ids[None, :].expand(W, K))

        self._keep_best(W, K, step, finished, top_token, top_eot, cand_score[:, :K], cand_beam[:, :K], window_rows)

        count = bs["finished_count"][:W]
        count.add_(finished.long().sum(1))
        top = bs["top_finished"][:W]
        top.copy_(top | finished[:, 0])
        enough = torch.where(bs["early_exit"][:W], top & (count >= 1), count >= bs["max_candidates"][:W])
        stop = alive & (last_step | enough)
        window_done = bs["window_done"][:W]
        window_done.copy_(window_done | stop)
        go_on = alive & ~stop  # [W]

        # The surviving beams: reorder every beam's history by origin, then append the new token.
        new_beam = cand_beam.gather(1, next_candidate)
        new_token = cand_token.gather(1, next_candidate).flatten()
        new_score = cand_score.gather(1, next_candidate).flatten()
        identity = torch.arange(R, device=device)
        origin = torch.where(go_on[:, None], window_rows + new_beam, identity.view(W, K)).flatten()
        names = ["out_tokens", "last", "penultimate", "last_timestamp"] + (["seen"] if penalize else [])
        if device.type == "cpu":
            self._reorder_moved_rows(origin, R, filled, names)
        else:  # graph-safe
            caches = [ds[name][:, :R, :, :filled] for name in ("self_k", "self_v")]
            if kernels_can_run(device):  # only the rows that move, only the positions written (every layer in one launch)
                group_reorder.reorder_in_groups(caches, origin, K, ds["position"][:R] + 1)
            else:
                for cache in caches:
                    cache.copy_(cache.index_select(1, origin))
            for name in names:
                buf = ds[name][:R]
                buf.copy_(buf.index_select(0, origin))
        active = go_on[:, None].expand(W, K).flatten()
        running = ds["sum_logprob"][:R]
        running.copy_(torch.where(active, new_score, running))
        dec.append_tokens(R, new_token, active, penalize)
        ds["done"][:R].copy_(~active)

    def _reorder_moved_rows(self, origin: Tensor, R: int, filled: int, names: Sequence[str]) -> None:
        """The CPU's reorder: only the rows whose origin is another row are rewritten (most beams keep
        their own history from one step to the next; copying all of the self-attention cache twice
        per step was a quarter of a beam-5 transcription on two cores)."""
        ds = self.decoder.state
        origins = origin.tolist()
        moved = [r for r, o in enumerate(origins) if o != r]
        if not moved:
            return
        sources = [origins[r] for r in moved]
        for name in ("self_k", "self_v"):
            cache = ds[name][:, :R, :, :filled]
            # Row by row (the sources copied before any write): index_select/index_copy_ over this
            # strided view took 0.9 ms for two rows at 150 positions of tiny.en, these copies 0.08.
            copies = [cache[:, r].clone() for r in sources]
            for r, rows in zip(moved, copies):
                cache[:, r].copy_(rows)
        dst, src = torch.tensor(moved, device=origin.device), torch.tensor(sources, device=origin.device)
        for name in names:
            buf = ds[name][:R]
            buf.index_copy_(0, dst, buf.index_select(0, src))

    def _keep_best(
        self, W: int, K: int, step: Tensor, finished: Tensor, top_token: Tensor, top_eot: Tensor,
        top_score: Tensor, top_beam: Tensor, window_rows: Tensor,
    ) -> None:
        """Score this step's finished hypotheses and keep each window's best one so far."""
        ds, bs = self.decoder.state, self.state
        L = ds["out_tokens"].shape[1]
        length = torch.where(top_eot, step[:, None], step[:, None] + 1)  # end-of-text is not returned
        normalized = top_score / torch.pow(length.to(torch.float32), bs["length_penalty"])
        # A finished hypothesis always beats "none"; -inf scores (empty ones) rank just above it.
        lowest = torch.finfo(torch.float32).min
        key = torch.where(torch.isnan(normalized) | (normalized == float("-inf")),
                          torch.full_like(normalized, lowest), normalized)
        key = torch.where(finished, key, torch.full_like(key, float("-inf")))
        pick = key.argmax(dim=1, keepdim=True)  # the first of equals: registration order
        pick_key = key.gather(1, pick)[:, 0]
        better = finished.any(1) & (~bs["has_best"][:W] | (pick_key > bs["best_key"][:W]))

        origin_row = (window_rows + top_beam.gather(1, pick))[:, 0]
        tokens = ds["out_tokens"].index_select(0, origin_row)  # [W, L]: the origin beam's history
        cursor = step.clamp(max=L - 1)[:, None]
        tokens.scatter_(1, cursor, top_token.gather(1, pick))
        best = bs["best_tokens"][:W]
        best.copy_(torch.where(better[:, None], tokens, best))
        for name, value in (
            ("best_length", length.gather(1, pick)[:, 0]),
            ("best_raw", top_score.gather(1, pick)[:, 0]),
            ("best_key", pick_key),
        ):
            buf = bs[name][:W]
            buf.copy_(torch.where(better, value, buf))
        has = bs["has_best"][:W]
        has.copy_(has | better)

    # -- runs ----------------------------------------------------------------------------------
    def start(
        self, options: SearchOptions, suppress_tokens, suppress_at_begin, windows: int, batch_prefix: bool = False
    ) -> "BeamRun":
        return BeamRun(self, options, suppress_tokens, suppress_at_begin, windows, batch_prefix)


class BeamRun(SlotTable):
    """Beam search over windows admitted into free groups of K rows while other windows search."""

    def __init__(
        self, search: BeamSearch, options: SearchOptions, suppress, suppress_at_begin, windows: int,
        batch_prefix: bool = False,
    ):
        dec = search.decoder
        self.search, self.decoder, self.options = search, dec, options
        K = self.K = int(options.beam_size)
        if windows * K > dec.max_rows:
            raise ValueError(f"{windows} windows x beam size {K} need {windows * K} rows; the decoder holds {dec.max_rows}")
        if windows > dec.windows:
            raise ValueError(f"{windows} windows at once; the decoder holds {dec.windows}")
        if options.max_candidates < 1:
            raise ValueError("beam_size * patience must round to at least 1")
        self.windows = windows
        self.penalize = options.repetition_penalty != 1.0
        self.ngram = int(options.no_repeat_ngram_size)
        self.n_ctx = dec.model.dims.n_text_ctx
        self.batch_prefix = batch_prefix
        # Every cache bucket's graph before any window is loaded: capture runs on a reset state (on
        # the device loop one graph serves every length).
        buckets = (self.n_ctx,) if search.loops else CACHE_BUCKETS + (self.n_ctx,)
        for filled in sorted({cache_bucket(f, self.n_ctx) for f in buckets}, reverse=True):
            dec.capture_graph(search.graph, self._key(filled))
        dec.reset_rows()
        search.reset()
        dec.set_rules(suppress, suppress_at_begin, options)
        search.state["length_penalty"].fill_(options.length_penalty)
        super().__init__(windows)  # busy slot -> cache positions its rows may have written (host bound)
        self._launched = None  # an event behind the last advance (CUDA)
        self.clock = AdvanceClock(dec.device)  # how long advances keep the device busy (spare time)

    def _key(self, filled: int, windows: Optional[int] = None) -> BeamKey:
        bucket = self.n_ctx if self.search.loops else cache_bucket(filled, self.n_ctx)
        return BeamKey(windows or self.windows, self.K, self.penalize, self.ngram, bucket)

    @property
    def ready(self) -> bool:
        """Whether the last advance has finished on the device (``collect`` would not wait)."""
        return self._launched is None or self._launched.query()

    def admit(self, jobs: Sequence[WindowJob]) -> List[int]:
        """Load windows into free beam groups; returns their slots.

        With ``batch_prefix`` (set when the run was started), as CTranslate2 does for one batch, a
        forced prefix in any of the windows admitted together switches the prefix handling on for
        all of them; otherwise each window decides for itself (as when it is decoded alone).
        """
        tok = self.decoder.tokenizer
        requests = [j.request for j in jobs]
        slots = self.take(len(requests))
        starts = [prompt_length(r.prompt, tok.sot, tok.no_timestamps) for r in requests]
        self.decoder.admit_rows(slots, self.K, jobs)
        prefixed = [len(r.prompt) > start for r, start in zip(requests, starts)]
        if self.batch_prefix:
            prefixed = [any(prefixed)] * len(requests)
        bs = self.search.state
        index = torch.tensor(slots, device=self.decoder.device)

        def put(name, values):
            buf = bs[name]
            buf.index_copy_(0, index, torch.tensor(values, dtype=buf.dtype).to(buf.device))

        n = len(slots)
        put("window_done", [False] * n)
        put("max_candidates", [self.options.max_candidates] * n)
        put("early_exit", [self.options.length_penalty == 0] * n)
        put("best_key", [float("-inf")] * n)
        put("has_best", [False] * n)
        put("finished_count", [0] * n)
        put("top_finished", [False] * n)
        put("has_prefix", prefixed)
        for slot, start in zip(slots, starts):
            self.occupy(slot, start)  # step s writes cache position start - 1 + s
        return slots

    def use_spare_time(self) -> bool:
        """(While an advance runs) capture a graph deferred to spare time, if the device stays busy
        for as long as that takes; returns whether it did."""
        return self.decoder.capture_deferred(within=self.clock.seconds_left())

    def advance(self, refill: bool = True) -> None:
        """Beam steps: on the device loop until a window finishes, else ``steps_per_replay`` of them
        (``refill``: the scheduler's hint, not needed here)."""
        K = self.decoder.steps_per_replay
        filled = max(self.values()) + K  # a bound on the positions written by the end of this replay
        # Without graphs only the windows up to the last busy one step (GreedyRun.advance says why)
        windows = None if self.search.graph.use_graphs else self.extent()
        key = self._key(filled, windows)
        self.clock.launching(measure=not self.search.graph.may_capture(key))
        self.search.graph(key)
        self.clock.launched()
        if self.decoder.device.type == "cuda":
            self._launched = torch.cuda.Event()
            self._launched.record(torch.cuda.current_stream(self.decoder.device))
        if not self.search.loops:  # (the loop's launches run an unknown number of steps)
            for slot in self.slots():
                self[slot] += K

    def evict(self, slot: int) -> None:
        """Stop a window before it finished (its request was cancelled): its beams are free at once."""
        self.search.state["window_done"][slot] = True
        self.decoder.state["done"][slot * self.K : (slot + 1) * self.K] = True
        self.release(slot)

    def collect(self) -> Dict[int, WindowResult]:
        bs = self.search.state
        self._launched = None
        done = bs["window_done"][: self.windows].tolist()  # the one host sync per launch
        self.clock.collected()
        finished = [slot for slot in self.slots() if done[slot]]
        if not finished:
            return {}
        index = torch.tensor(finished, device=self.decoder.device)
        tokens = bs["best_tokens"].index_select(0, index).tolist()
        lengths = bs["best_length"].index_select(0, index).tolist()
        raw = bs["best_raw"].index_select(0, index).tolist()
        has = bs["has_best"].index_select(0, index).tolist()
        no_speech = self.decoder.state["no_speech"].index_select(0, index * self.K).tolist()
        results = {}
        for i, slot in enumerate(finished):
            if not has[i]:  # cannot happen: the last step finishes every beam
                results[slot] = WindowResult([], 0.0, no_speech[i], float("nan"))
            else:
                hyp = tokens[i][: lengths[i]]
                score = normalized_score(raw[i], len(hyp), self.options.length_penalty)
                results[slot] = WindowResult(hyp, raw[i], no_speech[i], score)
            self.release(slot)
        return results
