"""Greedy decoding of one 30-s window per row, with every per-step decision made on the device.

``WindowDecoder`` owns the device state of the decode loop (self-attention KV caches, the
cross-attention K/V of the current windows, token and rule buffers), all allocated once at the
largest batch size and written in place. A decode step is a plain function of that state: it
runs the decoder on each row's current token, applies Whisper's logit rules, picks the next token
and feeds it back into the state, masking rows that are done. The runtime's ``StepGraph`` runs it
eagerly (CPU, ``use_graphs=False``) or as a replayed CUDA graph per batch bucket; the host only
looks at the done flags every ``check_every`` steps.

The search follows CTranslate2's (what faster-whisper runs): a prompt is split where the
start-of-transcript sequence ends; the tokens after it are a prefix that is forced, one step at a
time, and returned with the generated tokens; steps count from the start token. Besides argmax,
a step can sample (Gumbel-max on the device, from the decoder's own seedable ``torch.Generator``)
with several independent rows per window (``best_of``), the best chosen by length-normalised
score. Beam search lives in ``beam.py`` and shares this decoder's state and rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...runtime import DeviceState, StepGraph, bucket_for
from .logit_rules import VocabLayout, apply_logit_rules
from .modules import Whisper
from .tokenizer import WhisperTokenizer


@dataclass
class WindowRequest:
    prompt: List[int]  # full prompt: previous text, SOT sequence, optional <|notimestamps|>, forced prefix
    timestamps: bool
    max_initial_timestamp_index: int
    max_new_tokens: int  # decoding steps from the start token on: forced prefix and end-of-text included


@dataclass
class WindowResult:
    tokens: List[int]  # forced prefix and generated tokens, end-of-text removed
    sum_logprob: float  # includes the end-of-text token's log-probability when it was produced
    no_speech_prob: float
    score: Optional[float] = None  # CTranslate2's score: sum_logprob / len(tokens) ** length_penalty


@dataclass(frozen=True)
class SearchOptions:
    """How one decoder call picks tokens; the same for every window of the call."""

    beam_size: int = 1
    patience: float = 1.0
    length_penalty: float = 1.0
    temperature: float = 0.0  # > 0: sample (beam_size must be 1)
    num_hypotheses: int = 1  # independent samples per window when sampling (best_of)
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @property
    def max_candidates(self) -> int:
        """Finished hypotheses a beam search collects before it stops: round(beam_size * patience)."""
        return max_candidates(self.beam_size, self.patience)


def max_candidates(beam_size: int, patience: float) -> int:
    # CTranslate2 rounds the float product half away from zero (std::round).
    return int(math.floor(float(np.float32(beam_size) * np.float32(patience)) + 0.5))


def prompt_length(prompt: Sequence[int], sot: int, no_timestamps: int) -> int:
    """Tokens up to the end of the start-of-transcript sequence, as CTranslate2 counts them.

    That is <|startoftranscript|> and the task tokens after it (language, task,
    <|notimestamps|>); whatever follows is a prefix the decoder is forced through.
    """
    try:
        index = list(prompt).index(sot)
    except ValueError:
        raise ValueError("the prompt has no <|startoftranscript|> token") from None
    while index < len(prompt) and sot <= prompt[index] <= no_timestamps:
        index += 1
    return index


def decode_budget(prompt: Sequence[int], sot: int, no_timestamps: int, max_length: int) -> int:
    """CTranslate2's step limit for a window: at most half the context, and never past its end."""
    start_step = prompt_length(prompt, sot, no_timestamps) - 1
    return min(max_length // 2, max_length - start_step)


def normalized_score(sum_logprob: float, length: int, length_penalty: float) -> float:
    """A hypothesis' final score as CTranslate2 computes it (float32): sum / length ** penalty."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        denominator = np.power(np.float32(length), np.float32(length_penalty))
        return float(np.float32(sum_logprob) / denominator)


def pick_best(scores: Sequence[float]) -> int:
    """Index of the highest score, the earliest on ties; NaN scores rank last."""
    return max(range(len(scores)), key=lambda i: (not math.isnan(scores[i]), scores[i], -i))


class WindowDecoder:
    def __init__(
        self,
        model: Whisper,
        tokenizer: WhisperTokenizer,
        device: torch.device,
        *,
        use_graphs: bool = True,
        buckets: Sequence[int] = (1,),
        check_every: int = 8,
        capacity: int = 1,
    ):
        """``buckets``: batch sizes of plain greedy calls (one graph each). ``capacity``: rows the
        state holds at least, for beam search (windows x beam) and sampling (windows x best_of)."""
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.buckets = tuple(sorted(buckets))
        self.check_every = check_every
        dims = model.dims
        self.layout = VocabLayout(dims.n_vocab, tokenizer.eot, tokenizer.no_timestamps, tokenizer.timestamp_begin)
        self.max_rows = max(self.buckets[-1], int(capacity))
        self.state = self._allocate_state()
        self.graph = StepGraph(self._step, device, use_graphs=use_graphs, name="whisper decode step")
        # Sampling draws from this generator only, so a seed gives the same tokens run after run.
        self.generator = torch.Generator(device=self.device)
        self.sample_graph = StepGraph(
            self._step, device, use_graphs=use_graphs, name="whisper sampling step", generators=(self.generator,)
        )
        self._beam = None

    @property
    def beam(self):
        """The beam search over this decoder's state (its own buffers are allocated on first use)."""
        if self._beam is None:
            from .beam import BeamSearch

            self._beam = BeamSearch(self)
        return self._beam

    def seed(self, seed: Optional[int]) -> None:
        """Seed the sampling generator; None picks a fresh random seed."""
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

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
        st.allocate("cross_k", (layers, rows, dims.n_text_head, dims.n_audio_ctx, head_dim), dtype)
        st.allocate("cross_v", (layers, rows, dims.n_text_head, dims.n_audio_ctx, head_dim), dtype)
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
        return st

    # Per-row buffers (rows on dim 0) and the self-attention caches (rows on dim 1).
    ROW_BUFFERS = (
        "token", "position", "n_generated", "max_new", "last", "penultimate", "last_timestamp", "done",
        "sum_logprob", "no_speech", "no_speech_at_step", "timestamps", "max_initial_timestamp",
        "out_tokens", "sample_begin", "prefix_tokens", "seen",
    )

    def _layer_views(self, name: str, rows: int) -> List[Tensor]:
        buf = self.state[name]
        return [buf[i, :rows] for i in range(buf.shape[0])]

    def _reset_rows(self) -> None:
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
    # A step key is the row count (plain greedy, one graph per bucket) or
    # ("greedy", rows, sample, penalize, ngram) when sampling or a repetition rule is on.
    @staticmethod
    def _parse_key(key) -> Tuple[int, bool, bool, int]:
        if isinstance(key, tuple):
            _, rows, sample, penalize, ngram = key
            return rows, sample, penalize, ngram
        return key, False, False, 0

    def _step(self, key) -> None:
        rows, sample, penalize, ngram = self._parse_key(key)
        st = self.state
        logits = self._run_decoder(rows)
        self._capture_no_speech(logits, rows)
        logprobs = torch.log_softmax(self._filter_logits(logits, rows, penalize, ngram), dim=-1)
        if sample:
            # Gumbel-max: argmax(log p / T + G) is a draw from softmax(log p / T).
            uniform = torch.rand(logprobs.shape, generator=self.generator, device=logprobs.device)
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
        self._append(rows, next_token, active, penalize)
        done = st["done"][:rows]
        done.copy_(done | (next_token == eot) | (n_gen >= st["max_new"][:rows]))

    def _run_decoder(self, rows: int) -> Tensor:
        """One decoder step on each row's current token: float32 logits [rows, n_vocab]."""
        st = self.state
        return self.model.decoder(
            st["token"][:rows, None],
            st["position"][:rows, None],
            self._layer_views("self_k", rows),
            self._layer_views("self_v", rows),
            self._layer_views("cross_k", rows),
            self._layer_views("cross_v", rows),
        )[:, 0]

    def _capture_no_speech(self, logits: Tensor, rows: int) -> None:
        # The no-speech probability is read off the raw logits at the <|startoftranscript|> step.
        st = self.state
        no_speech = torch.exp(logits[:, self.tokenizer.no_speech] - torch.logsumexp(logits, dim=-1))
        take = st["no_speech_at_step"][:rows] & (st["n_generated"][:rows] == 0) & ~st["done"][:rows]
        st["no_speech"][:rows].copy_(torch.where(take, no_speech, st["no_speech"][:rows]))

    def _filter_logits(self, logits: Tensor, rows: int, penalize: bool, ngram: int) -> Tensor:
        """The logits with CTranslate2's processors applied, in its order: repetition penalty,
        repeated n-grams, suppressed tokens, suppression at the first free step, timestamp rules."""
        st = self.state
        if penalize:
            p = st["repetition_penalty"]
            penalized = torch.where(logits < 0, logits * p, logits / p)
            logits = torch.where(st["seen"][:rows], penalized, logits)
        banned = self._repeated_ngrams(rows, ngram) if ngram > 0 else None
        return apply_logit_rules(
            logits, self.layout, st["suppress"], st["suppress_at_begin"], st["timestamps"][:rows],
            st["max_initial_timestamp"][:rows], st["n_generated"][:rows], st["last"][:rows],
            st["penultimate"][:rows], st["last_timestamp"][:rows],
            sample_begin=st["sample_begin"][:rows], banned=banned,
        )

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

    def _append(self, rows: int, next_token: Tensor, active: Tensor, penalize: bool) -> None:
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
        st["position"][:rows].add_(active.long())
        token = st["token"][:rows]
        token.copy_(torch.where(active, next_token, token))

    # -- one call: a batch of windows -----------------------------------------------------------
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
        if options.beam_size > 1:
            if options.sampling:
                raise ValueError("beam search does not sample: use temperature 0 with beam_size > 1")
            return self.beam.decode(audio_features, requests, suppress_tokens, suppress_at_begin, options)

        per = max(1, options.num_hypotheses) if options.sampling else 1
        penalize = options.repetition_penalty != 1.0
        ngram = int(options.no_repeat_ngram_size)
        if per == 1 and not (options.sampling or penalize or ngram):
            rows = bucket_for(n, self.buckets)
            key, graph = rows, self.graph
        else:
            rows = n * per
            if rows > self.max_rows:
                raise ValueError(f"{n} windows x {per} samples need {rows} rows; the decoder holds {self.max_rows}")
            key = ("greedy", rows, options.sampling, penalize, ngram)
            graph = self.sample_graph if options.sampling else self.graph
        self._capture(graph, key)
        self.load(audio_features, requests, per, suppress_tokens, suppress_at_begin, options)

        st = self.state
        max_steps = max(req.max_new_tokens for req in requests)
        done = st["done"][:rows]
        for step in range(max_steps):
            graph(key)
            if (step + 1) % self.check_every == 0 and bool(done.all()):
                break

        # One transfer for all results.
        n_gen = st["n_generated"][: n * per].tolist()
        out = st["out_tokens"][: n * per].tolist()
        sum_lp = st["sum_logprob"][: n * per].tolist()
        no_speech = st["no_speech"][: n * per].tolist()
        eot = self.tokenizer.eot
        results = []
        for window in range(n):
            candidates = []
            for row in range(window * per, (window + 1) * per):
                tokens = out[row][: n_gen[row]]
                while tokens and tokens[-1] == eot:
                    tokens.pop()
                score = normalized_score(sum_lp[row], len(tokens), options.length_penalty)
                candidates.append(WindowResult(tokens, sum_lp[row], no_speech[window * per], score))
            results.append(candidates[pick_best([c.score for c in candidates])])
        return results

    def _capture(self, graph: StepGraph, key) -> None:
        """Capture ``key``'s graph first if it has none yet: capture runs the step on a reset state."""
        if graph.use_graphs and not graph.is_captured(key):
            self._reset_rows()
            if self._beam is not None:
                self._beam.reset()
            graph.capture(key)

    def load(
        self,
        audio_features: Tensor,
        requests: Sequence[WindowRequest],
        per: int,
        suppress_tokens: Sequence[int],
        suppress_at_begin: Sequence[int],
        options: SearchOptions,
    ) -> None:
        """Fill the state for a call: ``per`` identical rows for each request (beams or samples)."""
        st = self.state
        self._reset_rows()
        self._set_mask("suppress", suppress_tokens)
        self._set_mask("suppress_at_begin", suppress_at_begin)
        st["temperature"].fill_(options.temperature if options.sampling else 1.0)
        st["repetition_penalty"].fill_(options.repetition_penalty)
        cross = self.model.decoder.cross_kv(audio_features)
        n = len(requests)
        for layer, (k, v) in enumerate(cross):
            st["cross_k"][layer, : n * per].copy_(k.repeat_interleave(per, dim=0))
            st["cross_v"][layer, : n * per].copy_(v.repeat_interleave(per, dim=0))
        for window, req in enumerate(requests):
            first = window * per
            self._prefill(first, req)
            if per > 1:
                self._copy_row(first, range(first + 1, first + per))

    def _copy_row(self, source: int, targets: Sequence[int]) -> None:
        st = self.state
        index = torch.tensor(list(targets), device=self.device)
        for name in self.ROW_BUFFERS:
            buf = st[name]
            row = buf[source : source + 1].clone()  # a copy: source and targets share the buffer
            buf.index_copy_(0, index, row.expand(len(index), *buf.shape[1:]))
        for name in ("self_k", "self_v"):
            buf = st[name]
            row = buf[:, source : source + 1].clone()
            buf.index_copy_(1, index, row.expand(-1, len(index), *buf.shape[2:]))

    def _set_mask(self, name: str, ids: Sequence[int]) -> None:
        mask = torch.zeros(self.model.dims.n_vocab, dtype=torch.bool)
        if len(ids):
            mask[torch.tensor(list(ids), dtype=torch.long)] = True
        self.state[name].copy_(mask)

    def _prefill(self, row: int, req: WindowRequest) -> None:
        """Run the prompt's context into the row's KV cache; set the row's loop state.

        As CTranslate2: the context is the prompt before the last token of the start-of-transcript
        sequence; decoding starts from that token, and the prompt's remaining tokens are forced.
        """
        st = self.state
        prompt = list(req.prompt)
        sot_index = prompt.index(self.tokenizer.sot)
        length = prompt_length(prompt, self.tokenizer.sot, self.tokenizer.no_timestamps)
        head, start, prefix = prompt[: length - 1], prompt[length - 1], prompt[length:]
        if len(head) + max(req.max_new_tokens, len(prefix) + 1) > self.model.dims.n_text_ctx:
            raise ValueError(
                f"prompt of {len(prompt)} tokens and {req.max_new_tokens} steps do not fit the text context"
            )
        if head:
            tokens = torch.tensor([head], dtype=torch.long, device=self.device)
            positions = torch.arange(len(head), device=self.device)[None, :]
            logits = self.model.decoder(
                tokens, positions,
                [t[row : row + 1] for t in self._layer_views("self_k", self.max_rows)],
                [t[row : row + 1] for t in self._layer_views("self_v", self.max_rows)],
                [t[row : row + 1] for t in self._layer_views("cross_k", self.max_rows)],
                [t[row : row + 1] for t in self._layer_views("cross_v", self.max_rows)],
            )[0]
        no_speech_at_step = sot_index == length - 1
        if not no_speech_at_step:
            probs = torch.softmax(logits[sot_index], dim=-1)
            st["no_speech"][row] = probs[self.tokenizer.no_speech]
        st["no_speech_at_step"][row] = no_speech_at_step
        st["token"][row] = start
        st["position"][row] = length - 1
        st["n_generated"][row] = 0
        st["max_new"][row] = req.max_new_tokens
        st["timestamps"][row] = req.timestamps
        st["max_initial_timestamp"][row] = req.max_initial_timestamp_index
        st["last"][row] = -1
        st["penultimate"][row] = -1
        st["last_timestamp"][row] = -1
        st["sum_logprob"][row] = 0.0
        st["sample_begin"][row] = len(prefix)
        if prefix:
            st["prefix_tokens"][row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        st["seen"][row] = False
        st["done"][row] = False
