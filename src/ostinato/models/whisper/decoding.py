"""Greedy decoding of one 30-s window per row, with every per-step decision made on the device.

``WindowDecoder`` owns the device state of the decode loop (self-attention KV caches, the
cross-attention K/V of the current windows, token and rule buffers), all allocated once at the
largest batch size and written in place. A decode step is a plain function of that state: it
runs the decoder on each row's current token, applies Whisper's logit rules, picks the next token
and feeds it back into the state, masking rows that are done. The runtime's ``StepGraph`` runs it
eagerly (CPU, ``use_graphs=False``) or as a replayed CUDA graph per batch bucket; the host only
looks at the done flags every ``check_every`` steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ...runtime import DeviceState, StepGraph, bucket_for
from .logit_rules import VocabLayout, apply_logit_rules
from .modules import Whisper
from .tokenizer import WhisperTokenizer


@dataclass
class WindowRequest:
    prompt: List[int]  # full prompt: previous text, SOT sequence, optional <|notimestamps|>
    timestamps: bool
    max_initial_timestamp_index: int
    max_new_tokens: int  # including the end-of-text token


@dataclass
class WindowResult:
    tokens: List[int]  # generated tokens, end-of-text removed
    sum_logprob: float  # includes the end-of-text token's log-probability when it was produced
    no_speech_prob: float


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
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.buckets = tuple(sorted(buckets))
        self.check_every = check_every
        dims = model.dims
        self.layout = VocabLayout(dims.n_vocab, tokenizer.eot, tokenizer.no_timestamps, tokenizer.timestamp_begin)
        self.max_rows = self.buckets[-1]
        self.state = self._allocate_state()
        self.graph = StepGraph(self._step, device, use_graphs=use_graphs, name="whisper decode step")

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
        st.allocate("suppress", (dims.n_vocab,), b)
        st.allocate("suppress_at_begin", (dims.n_vocab,), b)
        return st

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
        st["no_speech_at_step"].zero_()
        st["timestamps"].zero_()

    # -- the step ------------------------------------------------------------------------------
    def _step(self, rows: int) -> None:
        st = self.state
        token, position = st["token"][:rows], st["position"][:rows]
        n_gen, done = st["n_generated"][:rows], st["done"][:rows]
        last, penult, last_ts = st["last"][:rows], st["penultimate"][:rows], st["last_timestamp"][:rows]
        logits = self.model.decoder(
            token[:, None],
            position[:, None],
            self._layer_views("self_k", rows),
            self._layer_views("self_v", rows),
            self._layer_views("cross_k", rows),
            self._layer_views("cross_v", rows),
        )[:, 0]

        # The no-speech probability is read off the raw logits at the <|startoftranscript|> step.
        no_speech = torch.exp(logits[:, self.tokenizer.no_speech] - torch.logsumexp(logits, dim=-1))
        take = st["no_speech_at_step"][:rows] & (n_gen == 0) & ~done
        st["no_speech"][:rows].copy_(torch.where(take, no_speech, st["no_speech"][:rows]))

        logits = apply_logit_rules(
            logits, self.layout, st["suppress"], st["suppress_at_begin"], st["timestamps"][:rows],
            st["max_initial_timestamp"][:rows], n_gen, last, penult, last_ts,
        )
        next_token = logits.argmax(dim=-1)
        logprob = torch.log_softmax(logits, dim=-1).gather(1, next_token[:, None])[:, 0]

        active = ~done
        eot = self.tokenizer.eot
        next_token = torch.where(active, next_token, torch.full_like(next_token, eot))
        st["sum_logprob"][:rows].add_(torch.where(active, logprob, torch.zeros_like(logprob)))
        # Record the token at each active row's write cursor (done rows rewrite what is there).
        out = st["out_tokens"][:rows]
        cursor = n_gen.clamp(max=out.shape[1] - 1)[:, None]
        out.scatter_(1, cursor, torch.where(active[:, None], next_token[:, None], out.gather(1, cursor)))

        is_ts = next_token >= self.layout.timestamp_begin
        last_ts.copy_(torch.where(active & is_ts, next_token, last_ts))
        penult.copy_(torch.where(active, last, penult))
        last.copy_(torch.where(active, next_token, last))
        n_gen.add_(active.long())
        position.add_(active.long())
        token.copy_(torch.where(active, next_token, token))
        done.copy_(done | (next_token == eot) | (n_gen >= st["max_new"][:rows]))

    # -- one call: a batch of windows -----------------------------------------------------------
    def decode(
        self,
        audio_features: Tensor,
        requests: Sequence[WindowRequest],
        suppress_tokens: Sequence[int],
        suppress_at_begin: Sequence[int],
    ) -> List[WindowResult]:
        """Decode one window per row; ``audio_features`` is the encoder output [B, n_audio_ctx, d]."""
        n = len(requests)
        if audio_features.shape[0] != n:
            raise ValueError(f"{audio_features.shape[0]} windows of audio but {n} requests")
        rows = bucket_for(n, self.buckets)
        st = self.state
        if self.graph.use_graphs and not self.graph.is_captured(rows):
            self._reset_rows()
            self.graph.capture(rows)
        self._reset_rows()

        self._set_mask("suppress", suppress_tokens)
        self._set_mask("suppress_at_begin", suppress_at_begin)
        cross = self.model.decoder.cross_kv(audio_features)
        for layer, (k, v) in enumerate(cross):
            st["cross_k"][layer, :n].copy_(k)
            st["cross_v"][layer, :n].copy_(v)

        for row, req in enumerate(requests):
            self._prefill(row, req)

        max_steps = max(req.max_new_tokens for req in requests)
        done = st["done"][:rows]
        for step in range(max_steps):
            self.graph(rows)
            if (step + 1) % self.check_every == 0 and bool(done.all()):
                break

        # One transfer for all results.
        n_gen = st["n_generated"][:n].tolist()
        out = st["out_tokens"][:n].tolist()
        sum_lp = st["sum_logprob"][:n].tolist()
        no_speech = st["no_speech"][:n].tolist()
        eot = self.tokenizer.eot
        results = []
        for row in range(n):
            tokens = out[row][: n_gen[row]]
            while tokens and tokens[-1] == eot:
                tokens.pop()
            results.append(WindowResult(tokens, sum_lp[row], no_speech[row]))
        return results

    def _set_mask(self, name: str, ids: Sequence[int]) -> None:
        mask = torch.zeros(self.model.dims.n_vocab, dtype=torch.bool)
        if len(ids):
            mask[torch.tensor(list(ids), dtype=torch.long)] = True
        self.state[name].copy_(mask)

    def _prefill(self, row: int, req: WindowRequest) -> None:
        """Run the prompt up to its last token into the row's KV cache; set the row's loop state."""
        st = self.state
        prompt = req.prompt
        if len(prompt) + 1 > self.model.dims.n_text_ctx:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the text context")
        sot_index = prompt.index(self.tokenizer.sot)
        head = prompt[:-1]
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
        no_speech_at_step = sot_index == len(prompt) - 1
        if not no_speech_at_step:
            probs = torch.softmax(logits[sot_index], dim=-1)
            st["no_speech"][row] = probs[self.tokenizer.no_speech]
        st["no_speech_at_step"][row] = no_speech_at_step
        st["token"][row] = prompt[-1]
        st["position"][row] = len(prompt) - 1
        st["n_generated"][row] = 0
        st["max_new"][row] = req.max_new_tokens
        st["timestamps"][row] = req.timestamps
        st["max_initial_timestamp"][row] = req.max_initial_timestamp_index
        st["last"][row] = -1
        st["penultimate"][row] = -1
        st["last_timestamp"][row] = -1
        st["sum_logprob"][row] = 0.0
        st["done"][row] = False
