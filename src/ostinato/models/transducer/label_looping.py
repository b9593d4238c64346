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
nothing writes to a spare last column).

Utterances go through the runtime's ``RowScheduler``: a ``TransducerRun`` admits an utterance into
a free row (its projected encoder output, length and the prediction network's start state), and
a row whose utterance ended takes the next one at once. On CUDA one launch runs the step on the
device loop (``steps_per_replay`` unrolled steps per trip) until an utterance ends while others
wait for a row, or until every row is done when none waits; below that rung a replay runs
``steps_per_replay`` steps and the host reads the rows' active flags after each. On the CPU the
same step runs eagerly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ...errors import InvalidOptionError
from ...runtime import (
    DeviceState, RowScheduler, SlotTable, StepGraph, bucket_for, buckets_up_to, concat_rows, loop_rung,
    resolve_decode_loop, store_at,
)
from ...ops.triton_support import kernels_can_run
from . import kernels
from .decoder import Joint, PredictionNetwork

DEFAULT_TRANSDUCER_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class Hypothesis:
    tokens: List[int]
    frames: List[int]
    durations: Optional[List[int]]  # TDT only


class TransducerKey(NamedTuple):
    """A label-looping step graph: one per row bucket."""

    rows: int


@dataclass
class Utterance:
    """One utterance as a run admits it: encoder output [T, enc_hidden] and its valid frames."""

    encoded: Tensor
    length: int


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
        decode_loop: str = "auto",
    ):
        self.prednet = prednet
        self.joint = joint
        self.blank_id = int(blank_id)
        self.durations = [int(d) for d in durations]
        self.is_tdt = bool(self.durations)
        self.device = device
        self.decode_loop = resolve_decode_loop(decode_loop, torch.device(device), use_graphs)
        self.use_graphs = self.decode_loop != "eager"
        self.loop_rung = loop_rung(torch.device(device), self.use_graphs, int(steps_per_replay),
                                   guarded=self.decode_loop == "device")
        self.buckets = tuple(sorted(buckets))
        self.steps_per_replay = int(steps_per_replay)
        self.dtype = joint.out.weight.dtype
        # CUDA half precision: the step runs as five fused launches (kernels.py); else plain PyTorch
        self.fused = (
            kernels_can_run(joint.out.weight, joint.out.weight.dtype, interpreter=True)
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
        """The rows a run of ``batch`` concurrent utterances steps: the smallest bucket that holds
        them (past the largest bucket, exactly ``batch``)."""
        return bucket_for(batch, buckets_up_to(max(batch, max(self.buckets)), self.buckets))

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
        options = {}
        if self.decode_loop == "device":
            # enough trips for the longest utterance the state holds: each step moves a frame on or
            # emits a label, at most ``symbols`` labels per frame
            trips = math.ceil((frames * (symbols + 1) + 1) / self.steps_per_replay) + 2
            options = dict(loop_guard=self._loop_guard, max_loop_trips=trips)
        self.graph = StepGraph(self._replay_step, self.device, use_graphs=self.use_graphs,
                               steps_per_replay=1, name="transducer label-looping step", **options)

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
        # the prediction network's state after the blank/<SOS> input, per row: what an admitted row starts from
        st.allocate("h_start", (layers, rows, hidden), dt)
        st.allocate("c_start", (layers, rows, hidden), dt)
        st.allocate("g_start", (rows, joint_hidden), dt)
        # the device loop's guard: it goes on while more than ``active_floor`` rows are active, the
        # floor set on entry from ``stop_after``, the number of rows that may finish in one launch
        st.allocate("active_floor", (1,), i64)
        st.allocate("stop_after", (1,), i64, 1)
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
    def _loop_guard(self, key: TransducerKey, entering: bool) -> Tensor:
        """Whether the device loop runs another trip: while some row is active, and fewer than
        ``stop_after`` rows finished since the loop was entered (1 when utterances wait for a row).
        Two launches per trip (a sum and a comparison): the floor is worked out once, on entry."""
        st = self.state
        active = st["active"][: key.rows].sum()
        if entering:
            torch.clamp(active - st["stop_after"], min=0, out=st["active_floor"])
        return active > st["active_floor"]

    def _replay_step(self, key: TransducerKey) -> None:
        rows = key.rows
        if self.fused:
            for i in range(self.steps_per_replay):
                self.fused_step(rows, i % 2)
            if self.steps_per_replay % 2:
                self.state["h"][:, :rows].copy_(self.state["h_next"][:, :rows])
        else:
            for _ in range(self.steps_per_replay):
                self.step(rows)

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
    def open_run(self, rows: int, frames: int, max_symbols: int) -> "TransducerRun":
        """A run of ``rows`` rows (a bucket) for utterances of up to ``frames`` encoder frames."""
        return TransducerRun(self, rows, frames, max_symbols)

    @torch.inference_mode()
    def decode(self, enc: Tensor, lengths: Tensor, max_symbols: int = 10) -> List[Hypothesis]:
        """enc [B, T, enc_hidden] (encoder output), lengths [B] -> one hypothesis per row."""
        check_max_symbols(max_symbols)
        batch = enc.shape[0]
        if batch == 0:
            return []
        run = self.open_run(self.bucket(batch), max(enc.shape[1], 1), max_symbols)
        results: List[Optional[Hypothesis]] = [None] * batch
        scheduler = RowScheduler(lambda _: run)
        for i, n in enumerate(lengths.tolist()):
            scheduler.submit(max_symbols, Utterance(enc[i], int(n)), store_at(results, i))
        scheduler.run_until_idle()
        return results  # type: ignore[return-value]

    def nbytes(self) -> int:
        return self.state.nbytes() if self.state is not None else 0


def check_max_symbols(max_symbols) -> None:
    if not isinstance(max_symbols, int) or isinstance(max_symbols, bool) or max_symbols < 1:
        raise InvalidOptionError(f"max_symbols must be an integer >= 1, got {max_symbols!r}")


class TransducerRun(SlotTable):
    """Utterances admitted into free rows of one bucket, one row each, decoded until they end."""

    def __init__(self, decoder: LabelLoopingDecoder, rows: int, frames: int, max_symbols: int):
        super().__init__(rows)  # busy slot (= its row) -> nothing tracked
        self.decoder, self.rows, self.frames = decoder, rows, frames
        self.key = TransducerKey(rows)
        decoder._ensure_capacity(rows, frames, max_symbols)
        graph = decoder.graph
        if graph.use_graphs and not graph.is_captured(self.key) and graph.mode(self.key) != "eager":
            decoder._set_inactive()  # warm-up and capture run the step for real: on inactive rows only
            graph.capture(self.key)
        decoder._set_inactive()
        self._start_state(max_symbols)

    def _start_state(self, max_symbols: int) -> None:
        """Every row's start: the LSTM after the blank/<SOS> input (computed for all rows at once, so
        each row's numbers are the ones a batch of this size gives it)."""
        dec, st, rows = self.decoder, self.decoder.state, self.rows
        st["max_symbols"].fill_(max_symbols)
        h, c = st["h"][:, :rows], st["c"][:, :rows]
        h.zero_()
        c.zero_()
        start = torch.full((rows,), dec.blank_id, dtype=torch.int64, device=dec.device)
        g, h_new, c_new = dec.prednet.step(start, h, c)
        st["h_start"][:, :rows].copy_(h_new)
        st["c_start"][:, :rows].copy_(c_new)
        if dec.fused:
            dec._project_prediction(h_new[-1], rows)
            st["g_start"][:rows].copy_(st["g_proj"][:rows])
        else:
            st["g_start"][:rows].copy_(dec.joint.project_prediction(g))

    def admit(self, utterances: Sequence[Utterance]) -> List[int]:
        """Load utterances into free rows: projected encoder output, length, cursors, start state."""
        dec, st = self.decoder, self.decoder.state
        for u in utterances:
            if u.encoded.shape[0] > self.frames:
                raise ValueError(f"an utterance of {u.encoded.shape[0]} frames does not fit a run of {self.frames}")
        slots = self.take(len(utterances))
        index = torch.tensor(slots, device=dec.device)
        # one projection over the admitted utterances, padded to the longest (as a batch is encoded);
        # rows of one encoder batch admitted together are projected straight from it, without a copy
        if len({u.encoded.shape for u in utterances}) == 1:
            encoded = concat_rows([u.encoded[None] for u in utterances])
        else:
            width = max(u.encoded.shape[0] for u in utterances)
            encoded = utterances[0].encoded.new_zeros(len(utterances), width, utterances[0].encoded.shape[-1])
            for i, u in enumerate(utterances):
                encoded[i, : u.encoded.shape[0]] = u.encoded
        width = encoded.shape[1]
        st["enc_proj"][:, :width].index_copy_(0, index, dec.joint.project_encoder(encoded.to(dec.dtype)))
        lengths = torch.tensor([u.length for u in utterances], dtype=torch.int64).to(dec.device)
        st["length"].index_copy_(0, index, lengths)
        st["last_t"].index_copy_(0, index, torch.clamp(lengths - 1, min=0))
        st["active"].index_copy_(0, index, lengths > 0)
        for name in ("t", "n_tokens", "labels_at_frame"):
            st[name].index_fill_(0, index, 0)
        st["last_label_frame"].index_fill_(0, index, -1)
        for name in ("h", "c"):
            st[name].index_copy_(1, index, st[name + "_start"].index_select(1, index))
        st["g_proj"].index_copy_(0, index, st["g_start"].index_select(0, index))
        for slot in slots:
            self.occupy(slot, None)
        return slots

    def advance(self, refill: bool = False) -> None:
        """Step every row: on the device loop until an utterance ends (when others wait for a row,
        ``refill``) or all have ended; else ``steps_per_replay`` steps."""
        self.decoder.state["stop_after"].fill_(1 if refill else self.rows)
        self.decoder.graph(self.key)

    def evict(self, slot: int) -> None:
        """Stop an utterance before it ended (its request was cancelled): its row is free at once."""
        self.decoder.state["active"][slot] = False
        self.release(slot)

    def collect(self) -> Dict[int, Hypothesis]:
        dec, st = self.decoder, self.decoder.state
        # one read of every row's flag and token count: the one host sync when no utterance ended
        active, counts = torch.stack([st["active"][: self.rows].long(), st["n_tokens"][: self.rows]]).tolist()
        finished = [slot for slot in self.slots() if not active[slot]]
        if not finished:
            return {}
        width = max(counts[slot] for slot in finished)
        index = torch.tensor(finished, device=dec.device)
        names = ("out_labels", "out_frames") + (("out_durations",) if dec.is_tdt else ())
        outputs = torch.stack([st[name].index_select(0, index)[:, :width] for name in names]).tolist()
        results = {}
        for i, slot in enumerate(finished):
            n = counts[slot]
            durations = outputs[2][i][:n] if dec.is_tdt else None
            results[slot] = Hypothesis(outputs[0][i][:n], outputs[1][i][:n], durations)
            self.release(slot)
        return results
