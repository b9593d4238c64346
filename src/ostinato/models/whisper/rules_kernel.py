"""Whisper's logit rules, log-softmax and greedy choice of a decode step in one Triton kernel.

``apply_logit_rules`` followed by ``log_softmax``, ``argmax`` and ``gather`` (and the no-speech
probability read off the raw logits) run as about a hundred tiny kernels per step; here one program
per row does it all in three sweeps over the row:

1. the rule mask is rebuilt from the row's state (same comparisons as ``apply_logit_rules``) while
   the masked maximum and sum of exponentials are accumulated, separately for the text part
   ``[0, timestamp_begin)`` and the timestamp part (and, for the greedy choice, for the raw logits);
   the text part keeps one running (max, sum) per lane and reduces them once after its loop;
2. over the timestamp part only: the timestamps' log-probability mass, computed the way
   ``torch.logsumexp(logprobs[:, ts:])`` does, which decides the forced timestamp;
3. the output ``(x - max) - log(sum)`` (the order of PyTorch's CPU and CUDA log-softmax), over the
   surviving entries (the timestamps alone when forced); the greedy variant takes the first index of
   the largest of these values (each lane keeps the first index of its strict maximum, then the
   smallest index among the lanes holding the overall maximum) instead of, or besides, writing them.

``fused_greedy_step`` also does the rest of a greedy step in the same program: the forced prefix,
masking of finished rows, the score, the token record, the rules' token history and the done flag,
written into the decoder's row state (about 25 small PyTorch launches per step otherwise).

The vocabulary size and special ids are compile-time constants (one compiled kernel per vocabulary
layout); the launch grid is the batch, so the call can be captured in a CUDA graph. On an H100
(Triton 3.6, torch 2.11) a captured greedy choice took about 55 us at batch 1 and at batch 16
(dev/rules_kernel_tune.py), against 175 us at batch 1 for the PyTorch ops it replaces.

A greedy step needs only the choice, not the row of log-probabilities, and one program sweeping
51,864 entries three times was a quarter of tiny.en's step (50 us of 206 at one row on an H200).
``_greedy_split_kernel`` spreads each row over programs of ``CHUNK`` entries: each sweeps its chunk
once (masked and raw maximum and sum of exponentials, its largest masked logit), and the
row's last program to arrive (an arrival counter, as ``ops.skinny``'s split products) combines the
chunks in chunk order, sweeps the timestamps for the force rule and one chunk again for the first
index of the best log-probability: 13.5 us, and tiny.en's step 0.206 -> 0.170 ms at one row, 0.291 ->
0.256 at sixteen (H200). Its sums of exponentials are added in another order than the one-program
kernel's, so a log-probability may differ from it by an ulp or two; dev/rules_kernel_check.py holds
both to PyTorch's choices and values.

Exactness: the masks are the same integer comparisons; the maxima are exact; the log-probabilities
use PyTorch's formula, so values differ only by the rounding of the sum of exponentials (its order),
a few ulps. The argmax is taken over the log-probabilities as computed (not over the logits), first
index on ties, so logits that round to equal log-probabilities tie as they do in PyTorch. The force
test compares ``logsumexp(timestamp logprobs)`` with the best text logprob as ``apply_logit_rules``
does; only a margin of a few ulps between the two can decide differently.

Only CUDA runs these kernels in production (``TRITON_INTERPRET=1`` runs them on the CPU for tests);
callers check ``triton_support.kernels_can_run`` and otherwise use the PyTorch path.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .logit_rules import VocabLayout

from ... import settings
from ...ops.triton_support import HAVE_TRITON, arrival_counters, pdl_options, tl, triton  # noqa: F401

libdevice = None
if HAVE_TRITON:  # pragma: no cover - depends on the installation
    from ...ops.triton_support import pdl_enter

    try:
        from triton.language.extra import libdevice
    except Exception:
        libdevice = None

BLOCK = 4096  # vocabulary entries per iteration (13 iterations over Whisper's text part)
NUM_WARPS = 16  # one program sweeps a whole row: 16 warps took 56 us against 72 with 8 (H100, dev/rules_kernel_tune.py)
# The greedy choice without the log-probabilities written (a greedy decode step) splits each row's
# vocabulary into chunks of this many entries, a program each (26 for Whisper's vocabularies).
CHUNK = 2048
CHUNK_WARPS = 4
CHUNK_PARTS = 5  # what a chunk leaves in the workspace: masked max and sum, raw max and sum, largest masked logit
SPLIT_GREEDY = True  # False: the one-program-a-row kernel for it too (an A/B switch for benchmarks)




if HAVE_TRITON:

    @triton.jit
    def _exp(x, PRECISE: tl.constexpr):
        # tl.exp is ex2.approx on NVIDIA GPUs; libdevice's expf is what PyTorch's kernels call.
        if PRECISE:
            return libdevice.exp(x)
        else:
            return tl.exp(x)

    @triton.jit
    def _log(x, PRECISE: tl.constexpr):
        if PRECISE:
            return libdevice.log(x)
        else:
            return tl.log(x)

    @triton.jit
    def _masked_block(x_row, ids, valid, row, state, rules,
                      TS_BEGIN: tl.constexpr, EOT: tl.constexpr, NO_TS: tl.constexpr, HAS_BANNED: tl.constexpr):
        """(raw, masked) logits of one block: apply_logit_rules' mask, before the forced timestamp.
        ``state``: the launch's pointers (``_launch``'s ``state``); ``rules``: the row's (``_row_rules``)."""
        suppress_ptr, begin_ptr, banned_ptr, stride_ban = state[0], state[1], state[9], state[10]
        ts_on, last_ts, initial_limit, first = rules[0], rules[4], rules[5], rules[6]
        initial, pair_closed, pair_open, after_text = rules[8], rules[9], rules[10], rules[11]
        neg = float("-inf")
        x = tl.load(x_row + ids, mask=valid, other=neg).to(tl.float32)
        mask = tl.load(suppress_ptr + ids, mask=valid, other=0) != 0
        mask = mask | (first & (tl.load(begin_ptr + ids, mask=valid, other=0) != 0))
        if HAS_BANNED:
            mask = mask | (tl.load(banned_ptr + row * stride_ban + ids, mask=valid, other=0) != 0)
        is_ts = ids >= TS_BEGIN
        ts_mask = ids == NO_TS
        ts_mask = ts_mask | (initial & ((ids < TS_BEGIN) | (ids > initial_limit)))
        ts_mask = ts_mask | (pair_closed & is_ts)
        ts_mask = ts_mask | (pair_open & ((ids < EOT) | (is_ts & (ids < last_ts))))
        ts_mask = ts_mask | (after_text & is_ts & (ids <= last_ts))
        mask = mask | (ts_on & ts_mask) | (~valid)
        return x, tl.where(mask, neg, x)

    @triton.jit
    def _online(m, s, x, PRECISE: tl.constexpr):
        """Fold a block into a running (max, sum of exp(x - max)); all -inf leaves (-inf, 0)."""
        new_m = tl.maximum(m, tl.max(x, axis=0))
        safe = tl.where(new_m == float("-inf"), 0.0, new_m)
        # (_exp inlined: nested jit calls are what the CPU interpreter spends its time on)
        if PRECISE:
            s = s * libdevice.exp(m - safe) + tl.sum(libdevice.exp(x - safe), axis=0)
        else:
            s = s * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
        return new_m, s

    @triton.jit
    def _lane_online(m, s, x, PRECISE: tl.constexpr):
        """Per-lane running (max, sum of exp(x - max)), one exp per element; all -inf leaves (-inf, 0)."""
        new_m = tl.maximum(m, x)
        e = _exp(tl.minimum(m, x) - new_m, PRECISE)
        s = tl.where(x > m, s * e + 1.0, s + e)
        return new_m, tl.where(new_m == float("-inf"), 0.0, s)

    @triton.jit
    def _lane_total(m, s, PRECISE: tl.constexpr):
        """The row's (max, sum of exp(x - max)) from per-lane (or per-chunk) ones."""
        total_m = tl.max(m, axis=0)
        safe = tl.where(total_m == float("-inf"), 0.0, total_m)
        return total_m, tl.sum(s * _exp(m - safe, PRECISE), axis=0)

    @triton.jit
    def _row_rules(row, state, TS_BEGIN: tl.constexpr, HAS_SAMPLE_BEGIN: tl.constexpr):
        """The row's rule state, as apply_logit_rules derives it line by line: (ts_on, n_gen,
        sample_begin, last, last_ts, initial_limit, first, later, initial, pair_closed, pair_open,
        after_text)."""
        ts_flag_ptr, max_init_ptr, n_gen_ptr, last_ptr = state[2], state[3], state[4], state[5]
        penult_ptr, last_ts_ptr, sample_begin_ptr = state[6], state[7], state[8]
        ts_on = tl.load(ts_flag_ptr + row) != 0
        n_gen = tl.load(n_gen_ptr + row).to(tl.int64)
        if HAS_SAMPLE_BEGIN:
            sample_begin = tl.load(sample_begin_ptr + row).to(tl.int64)
        else:
            sample_begin = n_gen * 0
        last = tl.load(last_ptr + row).to(tl.int64)
        penult = tl.load(penult_ptr + row).to(tl.int64)
        last_ts = tl.load(last_ts_ptr + row).to(tl.int64)
        initial_limit = TS_BEGIN + tl.load(max_init_ptr + row).to(tl.int64)
        first = n_gen == sample_begin
        later = n_gen > sample_begin
        initial = first & (n_gen == 0)
        last_is_ts = last >= TS_BEGIN
        penult = tl.where(n_gen - 1 == sample_begin, last, penult)
        penult_is_ts = penult >= TS_BEGIN
        pair_closed = later & last_is_ts & penult_is_ts
        pair_open = later & last_is_ts & (~penult_is_ts)
        after_text = later & (~last_is_ts)
        return (ts_on, n_gen, sample_begin, last, last_ts, initial_limit, first, later, initial, pair_closed,
                pair_open, after_text)

    @triton.jit
    def _force_rule(x_row, row, state, rules, m_text, s_text, m_ts, s_ts,
                    V: tl.constexpr, TS_BEGIN: tl.constexpr, EOT: tl.constexpr, NO_TS: tl.constexpr,
                    HAS_BANNED: tl.constexpr, PRECISE: tl.constexpr, BLOCK_TS: tl.constexpr):
        """From the masked row's (max, sum of exps), text and timestamps apart: whether the timestamps
        are forced (a sweep over the timestamps, as apply_logit_rules decides it), and the max and
        log-sum of the log_softmax that is returned: (force, m_out, log_sum_out)."""
        neg = float("-inf")
        ts_on, later, pair_closed = rules[0], rules[7], rules[9]
        # log_softmax of the masked row: out = (x - m_all) - log_sum (PyTorch's order of operations).
        m_all = tl.maximum(m_text, m_ts)
        m_safe = tl.where(m_all == neg, 0.0, m_all)
        log_sum = _log(s_text * _exp(m_text - m_safe, PRECISE) + s_ts * _exp(m_ts - m_safe, PRECISE), PRECISE)
        # max over the text logprobs: rounding is monotonic, so it is the rounded max logit's logprob.
        max_text_logprob = (m_text - m_all) - log_sum
        # torch.logsumexp(logprobs[:, ts:]): max shift (0 where infinite), sum of exps, log, + shift.
        ts_shift = (m_ts - m_all) - log_sum
        ts_shift = tl.where((ts_shift == neg) | (ts_shift == float("inf")), 0.0, ts_shift)
        ts_acc = tl.full([], 0.0, tl.float32)
        for start in range(TS_BEGIN, V, BLOCK_TS):
            ids = start + tl.arange(0, BLOCK_TS)
            valid = ids < V
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            ts_acc += tl.sum(_exp(((xm - m_all) - log_sum) - ts_shift, PRECISE), axis=0)
        timestamp_logprob = _log(ts_acc, PRECISE) + ts_shift
        force = ts_on & later & (~pair_closed) & (timestamp_logprob > max_text_logprob)
        # The returned logits' log_softmax: the forced row keeps its timestamps only.
        m_out = tl.where(force, m_ts, m_all)
        log_sum_out = tl.where(force, _log(s_ts, PRECISE), log_sum)
        return force, m_out, log_sum_out

    @triton.jit
    def _finish_greedy(row, best_i, best_v, m_out, m_raw, s_raw, x_row, state, rules,
                       TS_BEGIN: tl.constexpr, EOT: tl.constexpr, NO_SPEECH: tl.constexpr, ADVANCE: tl.constexpr,
                       HAS_SEEN: tl.constexpr, PRECISE: tl.constexpr):
        """The greedy choice's results: a dead row's NaN, the no-speech probability, then the row's
        bookkeeping (ADVANCE) or the token, its log-probability and the probability stored."""
        neg = float("-inf")
        token_ptr, logprob_ptr, no_speech_ptr = state[11], state[12], state[13]
        # Every entry masked: PyTorch's log_softmax gives NaN everywhere, argmax the first (0).
        dead = m_out == neg
        best_i = tl.where(dead, 0, best_i)
        best_v = tl.where(dead, m_out - m_out, best_v)  # NaN
        # softmax(raw)[no_speech] as exp(x - torch.logsumexp(raw)).
        raw_shift = tl.where((m_raw == neg) | (m_raw == float("inf")), 0.0, m_raw)
        raw_lse = _log(s_raw, PRECISE) + raw_shift
        x_ns = tl.load(x_row + NO_SPEECH).to(tl.float32)
        no_speech_prob = _exp(x_ns - raw_lse, PRECISE)
        if ADVANCE:
            _advance_row(row, best_i, best_v, no_speech_prob, rules[1], rules[2], rules[3], state,
                         TS_BEGIN, EOT, HAS_SEEN)
        else:
            tl.store(token_ptr + row, best_i)
            tl.store(logprob_ptr + row, best_v)
            tl.store(no_speech_ptr + row, no_speech_prob)

    @triton.jit
    def _rules_kernel(
        logits_ptr, stride_l, out_ptr, stride_o,
        state,
        V: tl.constexpr, TS_BEGIN: tl.constexpr, EOT: tl.constexpr, NO_TS: tl.constexpr,
        NO_SPEECH: tl.constexpr,
        HAS_SAMPLE_BEGIN: tl.constexpr, HAS_BANNED: tl.constexpr,
        WRITE: tl.constexpr, GREEDY: tl.constexpr, ADVANCE: tl.constexpr, HAS_SEEN: tl.constexpr,
        PRECISE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_TS: tl.constexpr, PDL: tl.constexpr,
    ):
        if PDL:
            pdl_enter()
        row = tl.program_id(0).to(tl.int64)
        neg = float("-inf")
        x_row = logits_ptr + row * stride_l
        rules = _row_rules(row, state, TS_BEGIN, HAS_SAMPLE_BEGIN)

        # -- sweep 1: masked max / sum of exp, text and timestamps apart (and raw for no-speech) ----
        zero = tl.full([], 0.0, tl.float32)
        m_ts = zero + neg
        s_ts = zero
        m_raw = zero + neg  # (the text part sets these when GREEDY)
        s_raw = zero
        # Text part: per-lane running max / sum (no reduction inside the loop), reduced once after it.
        lane_m = tl.full([BLOCK], neg, tl.float32)
        lane_s = tl.zeros([BLOCK], tl.float32)
        lane_m_raw = tl.full([BLOCK], neg, tl.float32)
        lane_s_raw = tl.zeros([BLOCK], tl.float32)
        for start in range(0, TS_BEGIN, BLOCK):
            ids = start + tl.arange(0, BLOCK)
            valid = ids < TS_BEGIN
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            lane_m, lane_s = _lane_online(lane_m, lane_s, xm, PRECISE)
            if GREEDY:
                lane_m_raw, lane_s_raw = _lane_online(lane_m_raw, lane_s_raw, x, PRECISE)
        m_text, s_text = _lane_total(lane_m, lane_s, PRECISE)
        if GREEDY:
            m_raw, s_raw = _lane_total(lane_m_raw, lane_s_raw, PRECISE)
        # Timestamp part (1501 entries: one block): whole-block reductions.
        for start in range(TS_BEGIN, V, BLOCK_TS):
            ids = start + tl.arange(0, BLOCK_TS)
            valid = ids < V
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            m_ts, s_ts = _online(m_ts, s_ts, xm, PRECISE)
            if GREEDY:
                m_raw, s_raw = _online(m_raw, s_raw, x, PRECISE)

        force, m_out, log_sum_out = _force_rule(
            x_row, row, state, rules, m_text, s_text, m_ts, s_ts,
            V, TS_BEGIN, EOT, NO_TS, HAS_BANNED, PRECISE, BLOCK_TS)

        # -- sweep 3: write the log-probabilities, or take the first index of their maximum -------
        lane_v = tl.full([BLOCK], neg, tl.float32)
        lane_i = tl.zeros([BLOCK], tl.int32)
        for start in range(0, TS_BEGIN, BLOCK):
            ids = start + tl.arange(0, BLOCK)
            valid = ids < TS_BEGIN
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            out = (tl.where(force, neg, xm) - m_out) - log_sum_out
            if WRITE:
                tl.store(out_ptr + row * stride_o + ids, out, mask=valid)
            if GREEDY:
                # strictly greater: each lane keeps the first index of its maximum
                take = out > lane_v
                lane_i = tl.where(take, ids, lane_i)
                lane_v = tl.where(take, out, lane_v)
        if GREEDY:
            # the maximum over lanes, and the smallest index among the lanes that hold it
            best_v = tl.max(lane_v, axis=0)
            best_i = tl.min(tl.where(lane_v == best_v, lane_i, V), axis=0).to(tl.int64)
        for start in range(TS_BEGIN, V, BLOCK_TS):
            ids = start + tl.arange(0, BLOCK_TS)
            valid = ids < V
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            out = (xm - m_out) - log_sum_out
            if WRITE:
                tl.store(out_ptr + row * stride_o + ids, out, mask=valid)
            if GREEDY:
                out = tl.where(valid, out, neg)
                v, i = tl.max(out, axis=0, return_indices=True, return_indices_tie_break_left=True)
                take = v > best_v  # strictly: every text index comes first
                best_i = tl.where(take, start + i.to(tl.int64), best_i)
                best_v = tl.where(take, v, best_v)

        if GREEDY:
            _finish_greedy(row, best_i, best_v, m_out, m_raw, s_raw, x_row, state, rules,
                           TS_BEGIN, EOT, NO_SPEECH, ADVANCE, HAS_SEEN, PRECISE)

    @triton.jit
    def _advance_row(row, choice, logprob, no_speech_prob, n_gen, sample_begin, last, state,
                     TS_BEGIN: tl.constexpr, EOT: tl.constexpr, HAS_SEEN: tl.constexpr):
        """The greedy step's bookkeeping for one row, as WindowDecoder._step does it with PyTorch ops:
        the no-speech probability at the row's first step, the forced prefix, masking of finished
        rows, the score, the token record, the timestamp-rule history and the done flag.
        (token_ptr is the row's input token here: it becomes the chosen one.)"""
        n_gen_ptr, last_ptr, penult_ptr, last_ts_ptr, token_ptr = state[4], state[5], state[6], state[7], state[11]
        no_speech_ptr, done_ptr, max_new_ptr, position_ptr = state[13], state[14], state[15], state[16]
        sum_lp_ptr, ns_at_step_ptr, out_tokens_ptr, prefix_ptr, seen_ptr = state[17], state[18], state[19], state[20], state[21]
        stride_out_tokens, stride_prefix, stride_seen, n_cols = state[22], state[23], state[24], state[25]
        done = tl.load(done_ptr + row) != 0
        active = ~done
        if (tl.load(ns_at_step_ptr + row) != 0) & (n_gen == 0) & active:
            tl.store(no_speech_ptr + row, no_speech_prob)
        cursor = tl.minimum(n_gen, n_cols - 1)
        forced = n_gen < sample_begin
        token = tl.where(forced, tl.load(prefix_ptr + row * stride_prefix + cursor), choice)
        logprob = tl.where(forced, 0.0, logprob)
        if active:
            tl.store(sum_lp_ptr + row, tl.load(sum_lp_ptr + row) + logprob)
            tl.store(out_tokens_ptr + row * stride_out_tokens + cursor, token)
            if (n_gen >= sample_begin) & (token >= TS_BEGIN):  # rules look back over free tokens only
                tl.store(last_ts_ptr + row, token)
            tl.store(penult_ptr + row, last)
            tl.store(last_ptr + row, token)
            if HAS_SEEN:
                tl.store(seen_ptr + row * stride_seen + token, tl.full([], 1, tl.uint8))
            tl.store(n_gen_ptr + row, n_gen + 1)
            # Never past the context's last position (n_cols: out_tokens' width, the text context): a
            # window whose last token lands there ends, but a finished row is still stepped (feeding
            # end-of-text into its own dead cache) until the host or the loop looks.
            tl.store(position_ptr + row, tl.minimum(tl.load(position_ptr + row) + 1, n_cols - 1))
            tl.store(token_ptr + row, token)
            finished = (token == EOT) | (n_gen + 1 >= tl.load(max_new_ptr + row))
            tl.store(done_ptr + row, finished.to(tl.uint8))

    @triton.jit
    def _chunk_span(c, N_TEXT: tl.constexpr, V: tl.constexpr, TS_BEGIN: tl.constexpr, CHUNK: tl.constexpr):
        """Chunk c's vocabulary ids and which of them exist: text chunks first, then the timestamps'."""
        text = c < N_TEXT
        start = tl.where(text, c * CHUNK, TS_BEGIN + (c - N_TEXT) * CHUNK)
        ids = start + tl.arange(0, CHUNK)
        return ids, ids < tl.where(text, TS_BEGIN, V), text

    @triton.jit
    def _greedy_split_kernel(
        logits_ptr, stride_l, ws_ptr, lock_ptr,
        state,
        V: tl.constexpr, TS_BEGIN: tl.constexpr, EOT: tl.constexpr, NO_TS: tl.constexpr,
        NO_SPEECH: tl.constexpr, HAS_SAMPLE_BEGIN: tl.constexpr, HAS_BANNED: tl.constexpr,
        ADVANCE: tl.constexpr, HAS_SEEN: tl.constexpr, PRECISE: tl.constexpr,
        CHUNK: tl.constexpr, N_TEXT: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
        PARTS: tl.constexpr, BLOCK_TS: tl.constexpr, PDL: tl.constexpr,
    ):
        """The greedy choice with the row's vocabulary split over programs (row, chunk): each chunk's
        masked and raw (max, sum of exps) and its largest masked logit go to the workspace; the row's last program to arrive combines them in chunk order (so the result
        does not depend on which one is last), decides the force rule over the timestamps, and
        finds the first index of the largest log-probability: log-probabilities are a monotonic
        function of the masked logits, so the largest is that of the largest logit, and its first
        index lies in the first chunk whose largest logit gives that same value (two logits may
        round to one log-probability), which it sweeps again. A row that one program swept took
        50 us at one row on an H200; here the sweep is spread over about 26 programs."""
        if PDL:
            pdl_enter()
        row = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        neg = float("-inf")
        x_row = logits_ptr + row * stride_l
        rules = _row_rules(row, state, TS_BEGIN, HAS_SAMPLE_BEGIN)
        ids, valid, text = _chunk_span(c, N_TEXT, V, TS_BEGIN, CHUNK)
        x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
        m, s = _online(tl.full([], neg, tl.float32), tl.full([], 0.0, tl.float32), xm, PRECISE)
        m_raw, s_raw = _online(tl.full([], neg, tl.float32), tl.full([], 0.0, tl.float32), x, PRECISE)
        part = ws_ptr + (row * CHUNKS + c) * PARTS
        tl.store(part + 0, m)
        tl.store(part + 1, s)
        tl.store(part + 2, m_raw)
        tl.store(part + 3, s_raw)
        tl.store(part + 4, tl.max(xm, axis=0))
        # Every thread's stores are made before one thread's release of the arrival count.
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + row, 1, sem="acq_rel", scope="gpu")
        if arrived == CHUNKS - 1:
            parts = tl.arange(0, CHUNKS_P2)
            ok = parts < CHUNKS
            base = ws_ptr + (row * CHUNKS + parts) * PARTS
            pm = tl.load(base + 0, mask=ok, other=neg, cache_modifier=".cg")  # from L2: other SMs wrote these
            ps = tl.load(base + 1, mask=ok, other=0.0, cache_modifier=".cg")
            p_text = parts < N_TEXT
            m_text, s_text = _lane_total(tl.where(p_text, pm, neg), tl.where(p_text, ps, 0.0), PRECISE)
            m_ts, s_ts = _lane_total(tl.where(p_text, neg, pm), tl.where(p_text, 0.0, ps), PRECISE)
            m_raw, s_raw = _lane_total(tl.load(base + 2, mask=ok, other=neg, cache_modifier=".cg"),
                                    tl.load(base + 3, mask=ok, other=0.0, cache_modifier=".cg"), PRECISE)
            force, m_out, log_sum_out = _force_rule(
            x_row, row, state, rules, m_text, s_text, m_ts, s_ts,
                V, TS_BEGIN, EOT, NO_TS, HAS_BANNED, PRECISE, BLOCK_TS)
            # Each chunk's best log-probability, as the row's sweep computes them (a forced row keeps
            # its timestamps only); the first chunk holding the row's best, swept again for its index.
            tops = tl.load(base + 4, mask=ok, other=neg, cache_modifier=".cg")
            tops = tl.where(force & p_text, neg, tops)
            best_per_chunk = tl.where(ok, (tops - m_out) - log_sum_out, neg)
            best_v = tl.max(best_per_chunk, axis=0)
            c_best = tl.min(tl.where(best_per_chunk == best_v, parts, CHUNKS - 1), axis=0)
            ids, valid, text = _chunk_span(c_best, N_TEXT, V, TS_BEGIN, CHUNK)
            x, xm = _masked_block(x_row, ids, valid, row, state, rules, TS_BEGIN, EOT, NO_TS, HAS_BANNED)
            out = tl.where(valid, (tl.where(force & text, neg, xm) - m_out) - log_sum_out, neg)
            # The chunk's own best (the value best_v stands for, from this sweep's arithmetic), and
            # the first index holding it
            best_v = tl.max(out, axis=0)
            best_i = tl.min(tl.where(out == best_v, ids, V), axis=0).to(tl.int64)
            _finish_greedy(row, best_i, best_v, m_out, m_raw, s_raw, x_row, state, rules,
                           TS_BEGIN, EOT, NO_SPEECH, ADVANCE, HAS_SEEN, PRECISE)
            tl.atomic_xchg(lock_ptr + row, 0)  # ready for the next launch (graph replays reuse the counters)


def _flag(t: Tensor) -> Tensor:
    """A bool tensor as bytes for Triton (a view, no copy); other dtypes as they are."""
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype == torch.bool else t


# Half-precision logits are read as they come (each converted to float32 on load, the values of
# ``logits.float()``): a half model's step skips a conversion launch.
LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _launch(
    logits: Tensor, layout: VocabLayout, suppress: Tensor, suppress_at_begin: Tensor, timestamps: Tensor,
    max_initial_timestamp: Tensor, n_generated: Tensor, last_token: Tensor, penultimate_token: Tensor,
    last_timestamp: Tensor, sample_begin: Optional[Tensor], banned: Optional[Tensor],
    *, write: bool, greedy: bool, no_speech: int, rows_state: Optional[dict] = None,
):
    if not HAVE_TRITON:
        raise RuntimeError("Triton is not installed")
    if logits.dim() != 2 or logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"expected float32 or half logits [B, V], got {tuple(logits.shape)} {logits.dtype}")
    rows, n_vocab = logits.shape
    if not 0 < layout.timestamp_begin <= n_vocab:
        raise ValueError("timestamp_begin must lie inside the vocabulary")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    device = logits.device
    out = torch.empty((rows, n_vocab), dtype=torch.float32, device=device) if write else None
    fresh = greedy and rows_state is None
    token = torch.empty(rows, dtype=torch.int64, device=device) if fresh else None
    logprob = torch.empty(rows, dtype=torch.float32, device=device) if fresh else None
    no_speech_prob = torch.empty(rows, dtype=torch.float32, device=device) if fresh else None
    if rows == 0:
        return out, token, logprob, no_speech_prob
    n_gen = n_generated.contiguous()
    if banned is not None:
        banned = _flag(banned)
        if banned.stride(1) != 1:
            banned = banned.contiguous()
    dummy = n_gen  # stands for the optional pointers a specialisation never reads
    block_ts = min(BLOCK, triton.next_power_of_2(max(n_vocab - layout.timestamp_begin, 1)))
    advance = rows_state is not None
    if advance:
        st = rows_state
        token, no_speech_prob = st["token"], st["no_speech"]
        seen = _flag(st["seen"]) if st.get("seen") is not None else None
        state_args = (st["done"].view(torch.uint8), st["max_new"], st["position"], st["sum_logprob"],
                      _flag(st["no_speech_at_step"]), st["out_tokens"], st["prefix_tokens"],
                      seen if seen is not None else dummy,
                      st["out_tokens"].stride(0), st["prefix_tokens"].stride(0),
                      seen.stride(0) if seen is not None else 0, st["out_tokens"].shape[1])
    else:
        state_args = (dummy,) * 8 + (0, 0, 0, 1)
    # What both kernels take as one argument (``state``), read by position in the kernels' helpers:
    # 0-10 the rule state (suppress, suppress at begin, timestamps flag, max initial timestamp, tokens
    # generated, last, penultimate, last timestamp, sample begin, banned and its row stride), 11-13 the
    # outputs (token, log-probability, no-speech probability), 14-25 the row state (state_args).
    state = (
        _flag(suppress), _flag(suppress_at_begin), _flag(timestamps), max_initial_timestamp.contiguous(),
        n_gen, last_token.contiguous(), penultimate_token.contiguous(), last_timestamp.contiguous(),
        sample_begin.contiguous() if sample_begin is not None else dummy,
        banned if banned is not None else dummy, banned.stride(0) if banned is not None else 0,
        token if greedy else dummy, logprob if logprob is not None else logits,
        no_speech_prob if greedy else logits, *state_args,
    )
    constants = dict(
        V=n_vocab, TS_BEGIN=layout.timestamp_begin, EOT=layout.eot, NO_TS=layout.no_timestamps,
        NO_SPEECH=int(no_speech), HAS_SAMPLE_BEGIN=sample_begin is not None, HAS_BANNED=banned is not None,
        ADVANCE=advance, HAS_SEEN=advance and seen is not None,
        PRECISE=libdevice is not None and not settings.triton_interpreter(), BLOCK_TS=block_ts,
        **pdl_options(logits.device, rows),
    )
    if greedy and not write and SPLIT_GREEDY:  # the vocabulary split over programs (_greedy_split_kernel)
        n_text = -(-layout.timestamp_begin // CHUNK)
        chunks = n_text + -(-(n_vocab - layout.timestamp_begin) // CHUNK)
        workspace = torch.empty(rows * chunks * CHUNK_PARTS, dtype=torch.float32, device=device)
        _greedy_split_kernel[(rows, chunks)](
            logits, logits.stride(0), workspace, arrival_counters(device, rows), state,
            CHUNK=CHUNK, N_TEXT=n_text, CHUNKS=chunks, CHUNKS_P2=triton.next_power_of_2(chunks),
            PARTS=CHUNK_PARTS, num_warps=CHUNK_WARPS, **constants,
            enable_fp_fusion=False,  # the same arithmetic wherever a value is computed again (no contracted FMA)
        )
    else:
        _rules_kernel[(rows,)](
            logits, logits.stride(0), out if write else logits, n_vocab, state,
            WRITE=write, GREEDY=greedy, BLOCK=BLOCK, num_warps=NUM_WARPS, **constants,
        )
    return out, token, logprob, no_speech_prob


def fused_filtered_log_softmax(
    logits: Tensor,
    layout: VocabLayout,
    suppress: Tensor,
    suppress_at_begin: Tensor,
    timestamps: Tensor,
    max_initial_timestamp: Tensor,
    n_generated: Tensor,
    last_token: Tensor,
    penultimate_token: Tensor,
    last_timestamp: Tensor,
    sample_begin: Optional[Tensor] = None,
    banned: Optional[Tensor] = None,
) -> Tensor:
    """``torch.log_softmax(apply_logit_rules(...), dim=-1)`` in one kernel: float32 [B, V] with -inf
    at every disallowed token (NaN rows where nothing is allowed, as PyTorch). Arguments as
    ``apply_logit_rules``; CUDA tensors (or any device under ``TRITON_INTERPRET=1``)."""
    out, _, _, _ = _launch(
        logits, layout, suppress, suppress_at_begin, timestamps, max_initial_timestamp, n_generated,
        last_token, penultimate_token, last_timestamp, sample_begin, banned,
        write=True, greedy=False, no_speech=0,
    )
    return out


def fused_greedy_choice(
    logits: Tensor,
    layout: VocabLayout,
    suppress: Tensor,
    suppress_at_begin: Tensor,
    timestamps: Tensor,
    max_initial_timestamp: Tensor,
    n_generated: Tensor,
    last_token: Tensor,
    penultimate_token: Tensor,
    last_timestamp: Tensor,
    sample_begin: Optional[Tensor] = None,
    banned: Optional[Tensor] = None,
    *,
    no_speech: int,
    return_logprobs: bool = False,
) -> Tuple[Tensor, ...]:
    """The greedy step's decisions in one kernel, with ``logprobs = log_softmax(apply_logit_rules(...))``:

    * next_token int64 [B]: ``logprobs.argmax(-1)`` (first index of the maximum; 0 for a NaN row),
    * logprob float32 [B]: ``logprobs.gather(1, next_token)``,
    * no_speech_prob float32 [B]: ``softmax(logits)[:, no_speech]`` of the raw logits (before rules).

    ``return_logprobs=True`` also returns the [B, V] log-probabilities (written in the same sweep).
    """
    out, token, logprob, no_speech_prob = _launch(
        logits, layout, suppress, suppress_at_begin, timestamps, max_initial_timestamp, n_generated,
        last_token, penultimate_token, last_timestamp, sample_begin, banned,
        write=return_logprobs, greedy=True, no_speech=no_speech,
    )
    if return_logprobs:
        return token, logprob, no_speech_prob, out
    return token, logprob, no_speech_prob


def fused_greedy_step(logits: Tensor, layout: VocabLayout, *rule_state, no_speech: int, rows_state: dict) -> None:
    """``fused_greedy_choice`` and the step's bookkeeping in the same kernel, written in place.

    ``rule_state``: ``apply_logit_rules``' arguments after the logits and layout, in its order
    (``sample_begin`` included), as ``WindowDecoder._rule_state`` gives them; its ``n_generated``,
    last, penultimate and last-timestamp tensors are updated. ``rows_state`` holds the decoder's
    other per-row buffers (the first B rows, rows on dim 0): ``token`` (in: the fed token; out: the
    next), ``position``, ``max_new``, ``done``, ``sum_logprob``, ``no_speech``, ``no_speech_at_step``,
    ``out_tokens`` and ``prefix_tokens`` [B, n_ctx], and ``seen`` [B, V] or None (set when a
    repetition penalty is on). A finished row keeps its state and feeds end-of-text; a forced prefix
    step takes the prefix token and scores 0.
    """
    if not 9 <= len(rule_state) <= 10 or rule_state[8] is None:
        raise ValueError("fused_greedy_step: the rule state must run up to sample_begin (banned optional)")
    rule_state = tuple(rule_state) + (None,) * (10 - len(rule_state))
    # Written in place: views that .contiguous() would copy would lose the writes.
    flat = [rows_state[name] for name in ("token", "position", "max_new", "sum_logprob", "no_speech", "done",
                                          "no_speech_at_step")] + list(rule_state[4:8])
    tables = [rows_state["out_tokens"], rows_state["prefix_tokens"]] + (
        [rows_state["seen"]] if rows_state.get("seen") is not None else [])
    if not all(t.is_contiguous() for t in flat) or any(t.stride(1) != 1 for t in tables):
        raise ValueError("fused_greedy_step: the row state must be contiguous rows (it is written in place)")
    _launch(logits, layout, *rule_state, write=False, greedy=True, no_speech=no_speech, rows_state=rows_state)
