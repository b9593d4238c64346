"""Whisper's rules for which token may come next, as batched tensor ops (no host sync, graph-safe).

All per-row state (tokens generated so far, last two tokens, last timestamp) arrives as device
tensors, and every rule is a mask built with comparisons, so one captured graph serves every row
and every step. The rules follow Whisper's decoding as faster-whisper (CTranslate2) applies it:
suppressed ids; blank and end-of-text suppressed at the first sampled step; timestamps in pairs,
a pair closed by the same or a later timestamp and the next one opened strictly later, the first
one no later than ``max_initial_timestamp``; and a timestamp forced when the timestamp tokens
together are likelier than any single text token. After a forced prefix (``sample_begin`` > 0)
the first free step has no timestamp rule, as in CTranslate2 4.x.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class VocabLayout:
    n_vocab: int
    eot: int
    no_timestamps: int
    timestamp_begin: int


def apply_logit_rules(
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
    """Mask ``logits`` [B, V] (float32) with -inf where a token is not allowed; returns a new tensor.

    suppress, suppress_at_begin: [V] bool. timestamps: [B] bool (rules on for that row).
    max_initial_timestamp: [B] int (index of the latest allowed first timestamp).
    n_generated, last_token, penultimate_token, last_timestamp: [B] int64; last_timestamp is -1
    while a row has produced no timestamp (at or after ``sample_begin``).
    sample_begin: [B] int64, the step of the first freely chosen token (the length of a forced
    prefix, as CTranslate2 counts it; 0 when None). Before it only the suppression masks apply.
    banned: optional [B, V] bool of further tokens to disable (e.g. repeated n-grams).

    On the CPU the same masks are written row by row as ranges of ids (``_apply_by_rows``): a dozen
    [B, V] boolean tensors per step took 3 ms of a 16-ms beam-5 step of tiny.en on two cores.
    """
    if sample_begin is None:
        sample_begin = torch.zeros_like(n_generated)
    apply = _apply_by_rows if logits.device.type == "cpu" else _apply_as_tensors
    return apply(logits, layout, suppress, suppress_at_begin, timestamps, max_initial_timestamp, n_generated,
                 last_token, penultimate_token, last_timestamp, sample_begin, banned)


def _apply_as_tensors(logits: Tensor, layout: VocabLayout, suppress: Tensor, suppress_at_begin: Tensor,
                      timestamps: Tensor, max_initial_timestamp: Tensor, n_generated: Tensor, last_token: Tensor,
                      penultimate_token: Tensor, last_timestamp: Tensor, sample_begin: Tensor,
                      banned: Optional[Tensor]) -> Tensor:
    """``apply_logit_rules`` as batched tensor ops: no host sync, one graph for every row and step."""
    ids = torch.arange(logits.shape[-1], device=logits.device)
    is_timestamp_id = ids >= layout.timestamp_begin
    first = (n_generated == sample_begin)[:, None]
    later = (n_generated > sample_begin)[:, None]
    # The first-timestamp rule applies only when nothing was forced before it.
    initial = first & (n_generated == 0)[:, None]
    ts_rows = timestamps[:, None]

    mask = suppress[None, :] | (first & suppress_at_begin[None, :])
    if banned is not None:
        mask = mask | banned

    # Timestamp rules (rows with timestamps on).
    last_is_ts = (last_token >= layout.timestamp_begin)[:, None]
    # Right after the first sampled token, the "penultimate" token is that same token.
    penultimate = torch.where(n_generated - 1 == sample_begin, last_token, penultimate_token)
    penultimate_is_ts = (penultimate >= layout.timestamp_begin)[:, None]
    pair_closed = later & last_is_ts & penultimate_is_ts  # two timestamps in a row: text must follow
    pair_open = later & last_is_ts & ~penultimate_is_ts  # one timestamp: another or end-of-text
    after_text = later & ~last_is_ts
    initial_limit = (layout.timestamp_begin + max_initial_timestamp)[:, None]
    ts_mask = (
        (ids == layout.no_timestamps)[None, :]
        | (initial & ((ids < layout.timestamp_begin)[None, :] | (ids[None, :] > initial_limit)))
        | (pair_closed & is_timestamp_id[None, :])
        # A pair closes at the opening timestamp or later...
        | (pair_open & ((ids < layout.eot)[None, :] | (is_timestamp_id[None, :] & (ids[None, :] < last_timestamp[:, None]))))
        # ...and after text the next timestamp must be strictly later than the last one.
        | (after_text & is_timestamp_id[None, :] & (ids[None, :] <= last_timestamp[:, None]))
    )
    mask = mask | (ts_rows & ts_mask)
    logits = logits.masked_fill(mask, float("-inf"))

    # Where the timestamps together outweigh every text token, sample a timestamp.
    logprobs = torch.log_softmax(logits, dim=-1)
    timestamp_logprob = torch.logsumexp(logprobs[:, layout.timestamp_begin:], dim=-1)
    max_text_logprob = logprobs[:, : layout.timestamp_begin].max(dim=-1).values
    force = timestamps & later[:, 0] & ~pair_closed[:, 0] & (timestamp_logprob > max_text_logprob)
    return logits.masked_fill(force[:, None] & ~is_timestamp_id[None, :], float("-inf"))


def _apply_by_rows(logits: Tensor, layout: VocabLayout, suppress: Tensor, suppress_at_begin: Tensor,
                   timestamps: Tensor, max_initial_timestamp: Tensor, n_generated: Tensor, last_token: Tensor,
                   penultimate_token: Tensor, last_timestamp: Tensor, sample_begin: Tensor,
                   banned: Optional[Tensor]) -> Tensor:
    """``apply_logit_rules`` for host tensors: the same masks, each rule a slice of one row's ids (the
    vocabulary is text < end-of-text .. specials < timestamps, so every rule is a range)."""
    inf = float("-inf")
    begin, eot = layout.timestamp_begin, layout.eot
    out = logits.masked_fill(suppress[None, :], inf)
    if banned is not None:
        out.masked_fill_(banned, inf)
    forcing = []  # rows where the timestamp-forcing rule is looked at
    rows = zip(timestamps.tolist(), max_initial_timestamp.tolist(), n_generated.tolist(), sample_begin.tolist(),
               last_token.tolist(), penultimate_token.tolist(), last_timestamp.tolist())
    for b, (on, initial_max, step, begin_step, last, penultimate, last_ts) in enumerate(rows):
        row = out[b]
        if step == begin_step:
            row.masked_fill_(suppress_at_begin, inf)
        if not on:
            continue
        row[layout.no_timestamps] = inf
        if step == begin_step == 0:  # the first timestamp: no text, none after the limit
            row[:begin] = inf
            row[max(0, begin + initial_max + 1):] = inf
        if step <= begin_step:
            continue
        if step - 1 == begin_step:  # right after the first sampled token it is its own "penultimate"
            penultimate = last
        if last >= begin and penultimate >= begin:  # a pair just closed: text must follow
            row[begin:] = inf
            continue
        if last >= begin:  # one timestamp: another at least as late, or end-of-text
            row[:eot] = inf
            row[begin:max(begin, last_ts)] = inf
        else:  # after text the next timestamp is strictly later than the last one
            row[begin:max(begin, last_ts + 1)] = inf
        forcing.append(b)
    if forcing:
        # Where the timestamps together outweigh every text token, a timestamp it is.
        logprobs = torch.log_softmax(out, dim=-1)
        timestamp_logprob = torch.logsumexp(logprobs[:, begin:], dim=-1)
        max_text_logprob = logprobs[:, :begin].max(dim=-1).values
        force = (timestamp_logprob > max_text_logprob).tolist()
        for b in forcing:
            if force[b]:
                out[b, :begin] = inf
    return out
