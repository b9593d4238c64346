"""Why two greedy transducer decoders can part ways, decided in exact arithmetic.

Half-precision decoders that differ only in the order of their sums (a batched kernel against a
one-row cuBLAS product, say) round the joint's logits differently by an ulp or so. Where the two best
candidates (labels, or TDT durations) are that close, they may choose differently, and from there
on the utterances differ. This module tells such ties from real mistakes:

* ``plain_greedy_decode``: the textbook greedy TDT / RNN-T loop, one utterance at a time, a host
  sync per joint evaluation; it records every decision (label, frames moved on).
* ``record_decisions``: ostinato's decoder driven one step at a time (the same kernels its graphs
  replay), recording each row's decision, frame and its own rounded logit of the label it chose.
* ``exact_replay``: the same decisions replayed in float64 from the same (half-precision) weights
  and encoder output: per decision, how far below the exact best the chosen label / duration lies,
  in units of the half-precision ulp at the logits' magnitude, and how far the path's own rounded
  logit is from the exact one.
* ``compare_with_plain``: where ostinato and the plain loop first differ, both choices measured in
  float64 against the rounding the run itself shows.

The rule the tests assert: every decision of ostinato is the exact best or within ``2 x`` the largest
rounding error measured on the run (a tie), and where the plain loop differs, its choice at the first
difference is a tie by the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..models.transducer.label_looping import LabelLoopingDecoder, Utterance


# -- the plain loop --------------------------------------------------------------------------------
@torch.inference_mode()
def plain_greedy_decode(net, cfg, enc: Tensor, lengths, max_symbols: int):
    """The textbook greedy loop, one utterance at a time. Returns ``(hypotheses, decisions)``: per
    utterance (tokens, frames, durations), and per utterance the list of (label, frames moved on, TDT
    duration of an emitted label or -1) of every joint evaluation."""
    blank, n_dur = cfg.blank_id, len(cfg.durations)
    durations = cfg.durations
    hyps, logs = [], []
    for b in range(enc.shape[0]):
        n = int(lengths[b])
        f = net.joint.project_encoder(enc[b, :n])
        h = torch.zeros(cfg.pred_layers, 1, cfg.pred_hidden, device=enc.device, dtype=enc.dtype)
        c = torch.zeros_like(h)
        g, h, c = net.prednet.step(torch.tensor([blank], device=enc.device), h, c)
        g = net.joint.project_prediction(g)
        tokens, frames, durs, log = [], [], [], []
        t, at_frame = 0, 0
        while t < n:
            logits = net.joint(f[t:t + 1], g)[0]
            if n_dur:
                label = int(logits[:-n_dur].argmax())
                dur = durations[int(logits[-n_dur:].argmax())]
            else:
                label, dur = int(logits.argmax()), 0
            if label == blank:
                step = max(dur, 1)
                log.append((label, step, -1))
                t += step
                at_frame = 0
                continue
            tokens.append(label)
            frames.append(t)
            durs.append(dur)
            g, h, c = net.prednet.step(torch.tensor([label], device=enc.device), h, c)
            g = net.joint.project_prediction(g)
            step = dur
            if dur == 0:
                at_frame += 1
                if at_frame >= max_symbols:
                    step, at_frame = 1, 0
            else:
                at_frame = 0
            log.append((label, step, dur if n_dur else -1))
            t += step
        hyps.append((tokens, frames, durs if n_dur else None))
        logs.append(log)
    return hyps, logs


# -- ostinato, one step at a time ------------------------------------------------------------------
@dataclass
class DecisionLog:
    """Per step and row: the frame before the step, whether the row was active, the label chosen
    (blank when none was emitted), how many frames it moved on, the TDT duration recorded with an
    emitted label (-1 otherwise) and the path's own logit of the chosen label (NaN if not kept)."""

    t: np.ndarray
    active: np.ndarray
    label: np.ndarray
    advance: np.ndarray
    duration: np.ndarray
    logit: np.ndarray

    def row(self, r: int) -> List[Tuple[int, int, int]]:
        """Row ``r``'s decisions as the plain loop records them: (label, frames moved on, duration)."""
        steps = np.flatnonzero(self.active[:, r])
        return [(int(self.label[s, r]), int(self.advance[s, r]), int(self.duration[s, r])) for s in steps]

    def step_of(self, r: int, k: int) -> int:
        """The global step of row ``r``'s k-th decision."""
        return int(np.flatnonzero(self.active[:, r])[k])


@torch.inference_mode()
def record_decisions(decoder: LabelLoopingDecoder, enc: Tensor, lengths, max_symbols: int) -> DecisionLog:
    """Run ``decoder`` (built with ``steps_per_replay=1``) over a batch one step at a time, every row
    in one run, recording each row's decision after each step."""
    if decoder.steps_per_replay != 1:
        raise ValueError("record_decisions needs a decoder with steps_per_replay=1")
    lengths = [int(n) for n in lengths]
    batch = len(lengths)
    run = decoder.open_run(decoder.bucket(batch), max(enc.shape[1], 1), max_symbols)
    run.admit([Utterance(enc[i], n) for i, n in enumerate(lengths)])
    st = decoder.state
    rows = torch.arange(batch, device=decoder.device)
    blank = decoder.blank_id
    records = []
    while bool(st["active"][:batch].any()):
        t0 = st["t"][:batch].clone()
        n0 = st["n_tokens"][:batch].clone()
        active = st["active"][:batch].clone()
        if "logits" not in st:  # the plain PyTorch step: its logits are this same product, evaluated first
            step_rows = run.rows
            frame = torch.minimum(st["t"][:step_rows], st["last_t"][:step_rows])
            f = st["enc_proj"][st["row_index"][:step_rows], frame]
            own = decoder.joint(f, st["g_proj"][:step_rows])[:batch]
        decoder._replay_step(run.key)
        emitted = st["n_tokens"][:batch] > n0
        label = torch.where(emitted, st["out_labels"][rows, n0].long(), blank)
        if decoder.is_tdt:
            duration = torch.where(emitted, st["out_durations"][rows, n0].long(), -1)
        else:
            duration = torch.full_like(label, -1)
        logit = (st["logits"] if "logits" in st else own)[rows, label].double()
        records.append(torch.stack([t0.double(), active.double(), label.double(),
                                    (st["t"][:batch] - t0).double(), duration.double(), logit]))
    table = torch.stack(records).cpu().numpy() if records else np.zeros((0, 6, batch))
    return DecisionLog(t=table[:, 0].astype(np.int64), active=table[:, 1] > 0, label=table[:, 2].astype(np.int64),
                       advance=table[:, 3].astype(np.int64), duration=table[:, 4].astype(np.int64),
                       logit=table[:, 5])


# -- exact replay ----------------------------------------------------------------------------------
def half_ulp_units(x: Tensor, dtype: torch.dtype) -> Tensor:
    """The spacing of ``dtype`` (float16 / bfloat16) numbers at magnitude |x| (its smallest normal's
    spacing below that)."""
    info = torch.finfo(dtype)
    mag = torch.clamp(x.abs(), min=info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


@dataclass
class ExactReplay:
    """Per step and row (NaN where the row was inactive): how far below the exact best the chosen
    label and duration lie, and the path's rounding error of its chosen logit, all in ulps of the
    decoder's dtype at the compared logits' magnitude. ``probes`` holds the exact logits of the
    (step, row) pairs asked for."""

    label_margin: np.ndarray
    duration_margin: np.ndarray
    rounding_error: np.ndarray
    probes: Dict[Tuple[int, int], np.ndarray] = field(default_factory=dict)

    @property
    def largest_rounding_error(self) -> float:
        errors = self.rounding_error[np.isfinite(self.rounding_error)]
        return float(errors.max()) if errors.size else 0.0

    def tolerance(self) -> float:
        """A tie: two candidates whose exact logits are closer than two paths' worst rounding errors
        (never below one ulp: rounding alone moves a logit by half an ulp)."""
        return max(2.0 * self.largest_rounding_error, 1.0)

    def worst_margin(self) -> float:
        m = np.concatenate([self.label_margin.ravel(), self.duration_margin.ravel()])
        m = m[np.isfinite(m)]
        return float(m.max()) if m.size else 0.0


def _exact_logits(w, f64: Tensor, t: Tensor, g: Tensor) -> Tensor:
    rows = torch.arange(f64.shape[0], device=f64.device)
    return w["act"](f64[rows, t] + g) @ w["out_w"].t() + w["out_b"]


def _exact_lstm(w, labels: Tensor, h: Tensor, c: Tensor):
    x = w["embed"][labels]
    hs, cs = [], []
    for layer in range(h.shape[0]):
        gates = torch.cat((x, h[layer]), -1) @ w["lstm_w"][layer].t() + w["lstm_b"][layer]
        i, f, gg, o = gates.chunk(4, -1)
        c_new = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(gg)
        x = torch.sigmoid(o) * torch.tanh(c_new)
        hs.append(x)
        cs.append(c_new)
    return x, torch.stack(hs), torch.stack(cs)


@torch.inference_mode()
def exact_replay(net, cfg, enc: Tensor, lengths, log: DecisionLog,
                 probes: Sequence[Tuple[int, int]] = ()) -> ExactReplay:
    """Replay ``log``'s decisions in float64 from the same weights and encoder output, all rows at once."""
    dtype = enc.dtype
    dev = enc.device
    batch = log.active.shape[1]
    d = lambda p: p.detach().to(dev, torch.float64)  # noqa: E731
    joint, pred = net.joint, net.prednet
    w = {
        "out_w": d(joint.out.weight), "out_b": d(joint.out.bias), "act": joint.activation, "embed": d(pred.embed.weight),
        "lstm_w": [d(x) for x in pred.weights], "lstm_b": [d(x) for x in pred.biases],
    }
    f64 = enc[:batch].to(torch.float64) @ d(joint.enc.weight).t() + d(joint.enc.bias)
    last = torch.tensor([max(int(n) - 1, 0) for n in lengths[:batch]], device=dev)
    n_dur = len(cfg.durations)
    durations = torch.tensor(cfg.durations, device=dev)
    layers, hidden = cfg.pred_layers, cfg.pred_hidden
    h = torch.zeros(layers, batch, hidden, dtype=torch.float64, device=dev)
    c = torch.zeros_like(h)
    start = torch.full((batch,), cfg.blank_id, device=dev, dtype=torch.int64)
    out, h, c = _exact_lstm(w, start, h, c)
    g = out @ d(joint.pred.weight).t() + d(joint.pred.bias)
    steps = log.active.shape[0]
    label_margin = np.full((steps, batch), np.nan)
    duration_margin = np.full((steps, batch), np.nan)
    rounding_error = np.full((steps, batch), np.nan)
    wanted: Dict[int, List[int]] = {}
    for s, r in probes:
        wanted.setdefault(s, []).append(r)
    kept: Dict[Tuple[int, int], np.ndarray] = {}
    rows = torch.arange(batch, device=dev)
    for s in range(steps):
        t = torch.minimum(torch.as_tensor(log.t[s], device=dev), last)
        logits = _exact_logits(w, f64, t, g)
        for r in wanted.get(s, ()):
            kept[(s, r)] = logits[r].cpu().numpy()
        label = torch.as_tensor(log.label[s], device=dev)
        scores = logits[:, :-n_dur] if n_dur else logits
        best = scores.max(-1).values
        chosen = scores[rows, label]
        ulp = half_ulp_units(torch.maximum(best.abs(), chosen.abs()), dtype)
        lm = ((best - chosen) / ulp).cpu().numpy()
        own = torch.as_tensor(log.logit[s], device=dev)
        err = ((own - chosen).abs() / half_ulp_units(chosen, dtype)).cpu().numpy()
        emitted = label != cfg.blank_id
        if n_dur:
            dl = logits[:, -n_dur:]
            advance = torch.as_tensor(log.advance[s], device=dev)
            recorded = torch.as_tensor(log.duration[s], device=dev)
            # which durations give the decision: the recorded one with a label; with a blank, any
            # duration that moves on by the same number of frames (0 and 1 both move on by one)
            fits = torch.where(emitted[:, None], durations[None, :] == recorded[:, None],
                               torch.clamp(durations, min=1)[None, :] == advance[:, None])
            dbest = dl.max(-1).values
            dchosen = torch.where(fits, dl, -torch.inf).max(-1).values
            dulp = half_ulp_units(torch.maximum(dbest.abs(), dchosen.abs()), dtype)
            dm = ((dbest - dchosen) / dulp).cpu().numpy()
        else:
            dm = np.zeros(batch)
        act = log.active[s]
        label_margin[s, act] = lm[act]
        duration_margin[s, act] = dm[act]
        rounding_error[s, act] = err[act]
        feed = torch.as_tensor(act, device=dev) & emitted
        if bool(feed.any()):
            out, h_new, c_new = _exact_lstm(w, torch.where(feed, label, cfg.blank_id), h, c)
            g_new = out @ d(joint.pred.weight).t() + d(joint.pred.bias)
            g = torch.where(feed[:, None], g_new, g)
            h = torch.where(feed[None, :, None], h_new, h)
            c = torch.where(feed[None, :, None], c_new, c)
    return ExactReplay(label_margin, duration_margin, rounding_error, kept)


# -- ostinato against the plain loop ---------------------------------------------------------------
@dataclass
class Divergence:
    row: int
    decision: int  # index of the row's first differing decision
    step: int  # ostinato's global step of it
    frame: int
    ours: Tuple[int, int, int]  # (label, frames moved on, duration)
    plain: Tuple[int, int, int]
    what: str  # "label" or "duration"
    ours_margin: float  # ulps below the exact best
    plain_margin: float

    def describe(self, tolerance: float) -> str:
        tie = "a tie" if self.is_tie(tolerance) else "NOT a tie"
        return (f"utterance {self.row}: decision {self.decision} (frame {self.frame}) differs in the {self.what}: "
                f"ostinato {self.ours}, plain loop {self.plain}; exact float64: ostinato's choice "
                f"{self.ours_margin:.2f} ulp and the plain loop's {self.plain_margin:.2f} ulp below the best, "
                f"{tie} (tolerance {tolerance:.2f} ulp)")

    def is_tie(self, tolerance: float) -> bool:
        return self.ours_margin <= tolerance and self.plain_margin <= tolerance


def _choice_margin(logits: np.ndarray, cfg, dtype, choice: Tuple[int, int, int], what: str) -> float:
    """How far below the exact best a (label, frames moved on, duration) choice lies, in ulps."""
    n_dur = len(cfg.durations)
    label, advance, duration = choice
    if what == "label" or not n_dur:
        scores = logits[:-n_dur] if n_dur else logits
        best, chosen = scores.max(), scores[label]
    else:
        dl = logits[-n_dur:]
        ok = [j for j, d in enumerate(cfg.durations) if (max(d, 1) == advance if label == cfg.blank_id else d == duration)]
        best, chosen = dl.max(), max(dl[j] for j in ok)
    ulp = float(half_ulp_units(torch.tensor(max(abs(best), abs(chosen))), dtype))
    return float((best - chosen) / ulp)


def compare_with_plain(net, cfg, enc: Tensor, lengths, log: DecisionLog, plain_logs):
    """(rows identical to the plain loop, the first divergence of every other row measured exactly,
    the exact replay of ostinato's decisions)."""
    same, firsts = [], []
    for r, plain in enumerate(plain_logs):
        ours = log.row(r)
        k = next((i for i, (a, b) in enumerate(zip(ours, plain)) if a != b), None)
        if k is None and len(ours) == len(plain):
            same.append(r)
            continue
        k = k if k is not None else min(len(ours), len(plain))
        step = log.step_of(r, min(k, len(ours) - 1))
        firsts.append((r, k, step))
    probes = [(step, r) for r, _, step in firsts]
    replay = exact_replay(net, cfg, enc, lengths, log, probes)
    out = []
    for r, k, step in firsts:
        ours, plain = log.row(r), plain_logs[r]
        a = ours[k] if k < len(ours) else None
        b = plain[k] if k < len(plain) else None
        what = "label" if a is None or b is None or a[0] != b[0] else "duration"
        logits = replay.probes[(step, r)]
        ma = _choice_margin(logits, cfg, enc.dtype, a, what) if a else float("inf")
        mb = _choice_margin(logits, cfg, enc.dtype, b, what) if b else float("inf")
        out.append(Divergence(r, k, step, int(log.t[step, r]), a, b, what, ma, mb))
    return same, out, replay


# the most a half-precision path's logit may stray from the exact value and still count as rounding:
# products of a few hundred terms rounded to 11 bits, and a prediction state kept in half precision
MAX_ROUNDING_ULPS = 16.0


def check_ties(divergences: Sequence[Divergence], replay: ExactReplay) -> Optional[str]:
    """None when ostinato's every decision and every divergence are within the run's tolerance; else
    the first offence, in words. A logit further than ``MAX_ROUNDING_ULPS`` from its exact value is an
    offence itself (a wrong logit, not rounding), so a broken kernel cannot widen its own tolerance."""
    if replay.largest_rounding_error > MAX_ROUNDING_ULPS:
        e = replay.rounding_error
        s, r = np.unravel_index(np.nanargmax(e), e.shape)
        return (f"ostinato's logit of its choice at step {s} of row {r} is {e[s, r]:.2f} ulp from the exact value "
                f"(rounding explains at most {MAX_ROUNDING_ULPS:.0f})")
    tol = replay.tolerance()
    if replay.worst_margin() > tol:
        m = np.fmax(replay.label_margin, replay.duration_margin)
        s, r = np.unravel_index(np.nanargmax(m), m.shape)
        return f"ostinato's decision at step {s} of row {r} is {m[s, r]:.2f} ulp below the exact best (tolerance {tol:.2f})"
    for d in divergences:
        if not d.is_tie(tol):
            return d.describe(tol)
    return None
