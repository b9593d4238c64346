"""Greedy RNN-T / TDT decoding by label looping (arXiv 2406.06220), as graph-safe step functions.

NeMo's label-looping decoder nests two data-dependent loops (find the next label, advancing the frame
on blanks; then feed the labels found to the prediction network). Each row's work in it is the same
sequence of joint evaluations; here that sequence is flattened into one step that every row takes
at once, masked:

    logits = joint(enc_proj[row, min(t, last)], g)           label (and TDT duration) by argmax
    blank:  t += 1               (TDT: t += duration, a duration of 0 on blank counts as 1)
    label:  record (label, frame t, duration), feed it to the LSTM (h, c, g updated in place),
            TDT: t += duration; and when max_symbols labels share one frame (TDT: duration 0
            labels count), force the frame on by one
    active = t < length

which gives, row by row, NeMo's tokens, frames and durations (NeMo's bookkeeping of labels per
frame, ``last_nb_timestamp`` and ``last_nb_timestamp_lasts``, is reproduced exactly). Everything
lives in one ``DeviceState``: projected encoder output, LSTM state, the projected prediction output,
time cursors, masks, and hypotheses in preallocated buffers with write cursors (a row that emits
nothing writes to a spare last column). One replay runs ``steps_per_replay`` steps; the host reads a
single "any row active" flag after each replay. On the CPU the same step runs eagerly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ...errors import InvalidOptionError
from ...runtime import DeviceState, StepGraph
from . import kernels
from .decoder import Joint, PredictionNetwork

DEFAULT_TRANSDUCER_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class Hypothesis:
    tokens: List[int]
    frames: List[int]
    durations: Optional[List[int]]  # TDT only


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


class LabelLoopingDecoder:
    def __init__(
        self,
        prednet: PredictionNetwork,
        joint: Joint,
        blank_id: int,
        durations: Sequence[int],
        device: torch.device,
        *,
        use_graphs: bool = True,
        buckets: Sequence[int] = DEFAULT_TRANSDUCER_BUCKETS,
        steps_per_replay: int = 16,
    ):
        self.prednet = prednet
        self.joint = joint
        self.blank_id = int(blank_id)
        self.durations = [int(d) for d in durations]
        self.is_tdt = bool(self.durations)
        self.device = device
        self.use_graphs = use_graphs
        self.buckets = tuple(sorted(buckets))
        self.steps_per_replay = int(steps_per_replay)
        self.dtype = joint.out.weight.dtype
        # CUDA half precision: the step runs as five fused launches (kernels.py); else plain PyTorch
        self.fused = (
            kernels.available(joint.out.weight)
            and joint.enc.out_features % 16 == 0
            and prednet.hidden % 16 == 0
            and joint.out.weight.is_contiguous()
            and all(w.is_contiguous() for w in prednet.weights)
        )
        self.state: Optional[DeviceState] = None
        self.graph: Optional[StepGraph] = None
        self._rows = self._frames = self._symbols = 0

    # -- state ---------------------------------------------------------------------------------
    def bucket(self, batch: int) -> int:
        for b in self.buckets:
            if batch <= b:
                return b
        return batch

    def _ensure_capacity(self, rows: int, frames: int, max_symbols: int) -> None:
        if self.state is not None and rows <= self._rows and frames <= self._frames and max_symbols <= self._symbols:
            return
        # grow with headroom so that a run of slightly longer inputs does not reallocate every time
        rows = max(rows, self._rows)
        if frames > self._frames:
            frames = _round_up(max(frames, int(self._frames * 1.25), 512), 64)
        else:
            frames = self._frames
        symbols = max(max_symbols, self._symbols, 10)
        self.state = self._allocate(rows, frames, symbols)
        self._rows, self._frames, self._symbols = rows, frames, symbols
        # captured graphs hold the old buffers' addresses: start over with a fresh set
        self.graph = StepGraph(self._replay_step, self.device, use_graphs=self.use_graphs, name="transducer label-looping step")

    def _allocate(self, rows: int, frames: int, symbols: int) -> DeviceState:
        st = DeviceState(self.device)
        self.state = None  # free the old buffers before allocating new ones
        joint_hidden = self.joint.enc.out_features
        hidden, layers = self.prednet.hidden, self.prednet.num_layers
        i64, i32, dt = torch.int64, torch.int32, self.dtype
        capacity = frames * symbols  # at most max_symbols labels per frame
        st.allocate("enc_proj", (rows, frames, joint_hidden), dt)
        st.allocate("length", (rows,), i64)
        st.allocate("last_t", (rows,), i64)
        st.allocate("t", (rows,), i64)
        st.allocate("active", (rows,), torch.bool)
        st.allocate("g_proj", (rows, joint_hidden), dt)
        st.allocate("h", (layers, rows, hidden), dt)
        st.allocate("c", (layers, rows, hidden), dt)
        st.allocate("out_labels", (rows, capacity + 1), i32)
        st.allocate("out_frames", (rows, capacity + 1), i32)
        if self.is_tdt:
            st.allocate("out_durations", (rows, capacity + 1), i32)
            st.allocate("durations", (len(self.durations),), i64)
            st["durations"].copy_(torch.tensor(self.durations, dtype=i64))
        st.allocate("n_tokens", (rows,), i64)
        st.allocate("last_label_frame", (rows,), i64, -1)
        st.allocate("labels_at_frame", (rows,), i64)
        st.allocate("max_symbols", (1,), i64, 10)
        st.allocate("row_index", (rows,), i64)
        st["row_index"].copy_(torch.arange(rows, device=self.device))
        st.allocate("any_active", (1,), torch.bool)
        if self.fused:
            n_out = self.joint.out.out_features
            st.allocate("h_next", (layers, rows, hidden), dt)  # ping-pong partner of "h"
            st.allocate("logits", (rows, n_out), torch.float32)
            st.allocate("label", (rows,), i64)
            st.allocate("emit", (rows,), i32)
            if "durations" not in st:
                st.allocate("durations", (1,), i64)
            # layer 0's input term for every label, precomputed: embed @ W_ih0^T (float32)
            st.allocate("table0", (self.prednet.embed.num_embeddings, 4 * hidden), torch.float32)
            w_ih = self.prednet.weights[0][:, :hidden].float()
            torch.matmul(self.prednet.embed.weight.float(), w_ih.t(), out=st["table0"])
        self.capacity = capacity
        return st

    def _set_inactive(self) -> None:
        st = self.state
        st["length"].zero_()
        st["last_t"].zero_()
        st["t"].zero_()
        st["active"].zero_()
        st["n_tokens"].zero_()
        st["last_label_frame"].fill_(-1)
        st["labels_at_frame"].zero_()

    # -- the step ------------------------------------------------------------------------------
    def _replay_step(self, rows: int) -> None:
        if self.fused:
            for i in range(self.steps_per_replay):
                self.fused_step(rows, i % 2)
            if self.steps_per_replay % 2:
                self.state["h"][:, :rows].copy_(self.state["h_next"][:, :rows])
        else:
            for _ in range(self.steps_per_replay):
                self.step(rows)
        torch.any(self.state["active"][:rows], dim=0, keepdim=True, out=self.state["any_active"])

    def _project_prediction(self, h_last: Tensor, rows: int) -> None:
        """g_proj = pred(h of the last layer), as one product (also for rows whose h did not change:
        the same product of the same numbers, so their g_proj stays bit for bit)."""
        pred = self.joint.pred
        torch.addmm(pred.bias, h_last, pred.weight.t(), out=self.state["g_proj"][:rows])

    def fused_step(self, rows: int, parity: int) -> None:
        """``step`` as five launches (CUDA, half precision); h ping-pongs between "h" and "h_next"."""
        st = self.state
        h_in, h_out = (st["h"], st["h_next"]) if parity == 0 else (st["h_next"], st["h"])
        c = st["c"]
        logits = st["logits"][:rows]
        kernels.joint_logits(st["enc_proj"], st["t"], st["last_t"], st["g_proj"][:rows], self.joint.out.weight,
                             self.joint.out.bias, logits)
        n_labels = logits.shape[1] - len(self.durations)
        kernels.decode_tail(logits, n_labels, st["durations"], st["t"], st["length"], st["active"], st["n_tokens"],
                            st["last_label_frame"], st["labels_at_frame"], st["max_symbols"], st["out_labels"],
                            st["out_frames"], st["out_durations"] if self.is_tdt else None, self.capacity,
                            st["label"], st["emit"], self.blank_id, self.is_tdt)
        p = self.prednet
        for layer in range(p.num_layers):
            kernels.lstm_layer(
                None if layer == 0 else h_out[layer - 1, :rows], st["table0"] if layer == 0 else None, st["label"],
                h_in[layer, :rows], h_out[layer, :rows], c[layer, :rows], p.weights[layer], p.biases[layer], st["emit"],
            )
        self._project_prediction(h_out[p.num_layers - 1, :rows], rows)

    def step(self, rows: int) -> None:
        """One joint evaluation for every row of the bucket, masked; graph-safe (no host sync)."""
        st = self.state
        t, active = st["t"][:rows], st["active"][:rows]
        length = st["length"][:rows]
        g_proj = st["g_proj"][:rows]
        h, c = st["h"][:, :rows], st["c"][:, :rows]
        safe_t = torch.minimum(t, st["last_t"][:rows])
        f = st["enc_proj"][st["row_index"][:rows], safe_t]
        logits = self.joint(f, g_proj)
        if self.is_tdt:
            n = len(self.durations)
            _, labels = logits[:, :-n].max(dim=-1)
            duration = st["durations"][logits[:, -n:].argmax(dim=-1)]
            blank = labels == self.blank_id
            duration = torch.where(blank & (duration == 0), 1, duration)
        else:
            _, labels = logits.max(dim=-1)
            blank = labels == self.blank_id
            duration = blank.to(torch.int64)
        emit = active & ~blank

        # record the label at its frame (rows that emit nothing write to the spare last column)
        cursor = st["n_tokens"][:rows]
        column = torch.where(emit, cursor, self.capacity)[:, None]
        st["out_labels"][:rows].scatter_(1, column, labels[:, None].to(torch.int32))
        st["out_frames"][:rows].scatter_(1, column, t[:, None].to(torch.int32))
        if self.is_tdt:
            st["out_durations"][:rows].scatter_(1, column, duration[:, None].to(torch.int32))
        cursor.add_(emit.to(torch.int64))
        last_frame, count = st["last_label_frame"][:rows], st["labels_at_frame"][:rows]
        count.copy_(torch.where(emit, torch.where(last_frame == t, count + 1, 1), count))
        last_frame.copy_(torch.where(emit, t, last_frame))
        new_t = torch.where(active, t + duration, t)

        # feed the emitted labels to the prediction network; other rows keep their state
        g, h_new, c_new = self.prednet.step(labels, h, c)
        g = self.joint.project_prediction(g)
        g_proj.copy_(torch.where(emit[:, None], g, g_proj))
        h.copy_(torch.where(emit[None, :, None], h_new, h))
        c.copy_(torch.where(emit[None, :, None], c_new, c))

        # max_symbols labels on one frame: move on by one frame
        force = emit & (new_t < length) & (count >= st["max_symbols"]) & (last_frame == new_t)
        new_t = new_t + force.to(torch.int64)
        t.copy_(new_t)
        active.copy_(new_t < length)

    # -- decoding ------------------------------------------------------------------------------
    def _prepare(self, rows: int, enc: Tensor, lengths: Tensor, max_symbols: int) -> None:
        """Fill the state for a batch (eagerly; the start state is the LSTM after the blank/<SOS> input)."""
        st = self.state
        batch, frames = enc.shape[0], enc.shape[1]
        self._set_inactive()
        st["enc_proj"][:batch, :frames].copy_(self.joint.project_encoder(enc.to(self.dtype)))
        lengths = lengths.to(self.device, torch.int64)
        st["length"][:batch].copy_(lengths)
        st["last_t"][:batch].copy_(torch.clamp(lengths - 1, min=0))
        st["active"][:batch].copy_(lengths > 0)
        st["max_symbols"].fill_(max_symbols)
        h, c = st["h"][:, :rows], st["c"][:, :rows]
        h.zero_()
        c.zero_()
        start = torch.full((rows,), self.blank_id, dtype=torch.int64, device=self.device)
        g, h_new, c_new = self.prednet.step(start, h, c)
        h.copy_(h_new)
        c.copy_(c_new)
        if self.fused:
            self._project_prediction(h[-1], rows)
        else:
            st["g_proj"][:rows].copy_(self.joint.project_prediction(g))

    @torch.inference_mode()
    def decode(self, enc: Tensor, lengths: Tensor, max_symbols: int = 10) -> List[Hypothesis]:
        """enc [B, T, enc_hidden] (encoder output), lengths [B] -> one hypothesis per row."""
        if not isinstance(max_symbols, int) or isinstance(max_symbols, bool) or max_symbols < 1:
            raise InvalidOptionError(f"max_symbols must be an integer >= 1, got {max_symbols!r}")
        batch, frames = enc.shape[0], enc.shape[1]
        if batch == 0:
            return []
        rows = self.bucket(batch)
        self._ensure_capacity(rows, max(frames, 1), max_symbols)
        if self.graph.use_graphs and not self.graph.is_captured(rows) and self.graph.mode(rows) != "eager":
            self._set_inactive()  # warm-up and capture run the step for real: on inactive rows only
            self.graph.capture(rows)
        self._prepare(rows, enc, lengths, max_symbols)
        max_len = int(lengths.max()) if lengths.numel() else 0
        # each step advances a frame or emits a label, at most max_symbols per frame
        limit = math.ceil((max_len * (max_symbols + 1) + 1) / self.steps_per_replay) + 1
        st = self.state
        for _ in range(limit):
            self.graph(rows)
            if not bool(st["any_active"].item()):
                break
        else:  # pragma: no cover - bounded by construction
            raise RuntimeError("label-looping decode did not finish within its step bound")
        counts = st["n_tokens"][:batch].cpu().tolist()
        width = max(counts) if counts else 0
        labels = st["out_labels"][:batch, :width].cpu().tolist()
        frames_out = st["out_frames"][:batch, :width].cpu().tolist()
        durs = st["out_durations"][:batch, :width].cpu().tolist() if self.is_tdt else None
        return [
            Hypothesis(labels[i][:n], frames_out[i][:n], durs[i][:n] if durs is not None else None)
            for i, n in enumerate(counts)
        ]

    def nbytes(self) -> int:
        return self.state.nbytes() if self.state is not None else 0
