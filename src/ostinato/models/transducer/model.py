"""``TransducerModel``: a NeMo FastConformer RNN-T / TDT checkpoint on one device, ready to transcribe."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...audio import FRAMES_PER_SECOND, load_audio
from ...checks import check_positive_int
from ...errors import AudioError, InvalidOptionError, UnsupportedCheckpointError
from ...results import Segment, TranscriptionInfo
from ...runtime import (
    RowScheduler, host_values_to_device, memory_report, padded_host_batch, place_module, resolve_device, resolve_dtype,
    set_cpu_threads, store_at, strict_float32, upload_batches,
)
from ...runtime.preparation import prepared_in_background
from ...ops import cpu_linear
from .decoder import Joint, PredictionNetwork, decoder_state_from_nemo, joint_state_from_nemo
from .encoder import FastConformerEncoder, encoder_state_from_nemo, subsampled_length
from .label_looping import DEFAULT_TRANSDUCER_BUCKETS, Hypothesis, LabelLoopingDecoder, Utterance, check_max_symbols
from .nemo_checkpoint import TransducerConfig, load_nemo
from .preprocessor import MelPreprocessor

AudioInput = Union[str, Path, bytes, np.ndarray, Tensor]


@dataclass
class TransducerResult:
    text: str
    tokens: List[int]
    frames: List[int]  # encoder frame of each token
    durations: Optional[List[int]]  # TDT: predicted duration of each token, in encoder frames
    timestamps: List[float] = field(default_factory=list)  # start of each token, seconds
    audio_duration: float = 0.0
    frame_seconds: float = 0.08


class TransducerNetwork(nn.Module):
    """Encoder, prediction network and joint: the weights, one copy on the device."""

    def __init__(self, cfg: TransducerConfig):
        super().__init__()
        self.encoder = FastConformerEncoder(cfg.encoder)
        self.prednet = PredictionNetwork(cfg.vocab_size, cfg.pred_hidden, cfg.pred_layers)
        self.joint = Joint(cfg.encoder.d_model, cfg.pred_hidden, cfg.joint_hidden,
                           cfg.vocab_size + 1 + len(cfg.durations), cfg.joint_activation)

    @classmethod
    def from_nemo(cls, cfg: TransducerConfig, sd, path: str = "model") -> "TransducerNetwork":
        net = cls(cfg)
        try:
            parts = (
                (net.encoder, encoder_state_from_nemo(sd, cfg.encoder)),
                (net.prednet, decoder_state_from_nemo(sd, cfg)),
                (net.joint, joint_state_from_nemo(sd)),
            )
        except KeyError as exc:
            raise UnsupportedCheckpointError(
                f"{path}: model_weights.ckpt lacks the weight {exc.args[0]!r} that the config's architecture needs"
            ) from None
        for module, state in parts:
            try:
                module.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                first = str(exc).splitlines()
                detail = " ".join(line.strip() for line in first[:3])
                raise UnsupportedCheckpointError(f"{path}: weights do not match the config: {detail}") from None
        return net


class TransducerModel:
    """A NeMo FastConformer RNN-T or TDT model (e.g. Parakeet) on one device.

    path: a ``.nemo`` file. device: "auto", "cpu", "cuda", "cuda:N". compute_type: "auto"
    (float16 on CUDA, float32 on the CPU), "float32", "float16", "bfloat16". use_graphs: replay the
    decode loop as CUDA graphs (one per batch bucket) on CUDA devices. cpu_threads: PyTorch's
    intra-op threads for CPU work (process-wide); 0 uses one per physical core on the CPU.

    Long audio: up to ``max_full_context_seconds`` the encoder attends over the whole input; longer
    inputs are encoded in ``chunk_seconds`` windows with ``chunk_context_seconds`` of extra context
    on each side (dropped from the output), stitched into one encoder sequence that is decoded in
    one continuous pass, so no word is cut at a window boundary.
    """

    def __init__(
        self,
        path: Union[str, Path],
        device: str = "auto",
        compute_type: str = "auto",
        use_graphs: bool = True,
        *,
        buckets: Sequence[int] = DEFAULT_TRANSDUCER_BUCKETS,
        steps_per_replay: int = 16,
        max_full_context_seconds: float = 300.0,
        chunk_seconds: float = 60.0,
        chunk_context_seconds: float = 10.0,
        chunk_batch: int = 8,
        decode_loop: str = "auto",
        cpu_threads: int = 0,
    ):
        with prepared_in_background(resolve_device(device)):  # first-call work (Triton, CUDA libraries) beside the load
            checkpoint = load_nemo(path)
            sd = checkpoint.state_dict
            preprocessor = MelPreprocessor(
                checkpoint.config.preprocessor, sd.get("preprocessor.featurizer.window"),
                sd.get("preprocessor.featurizer.fb")
            )
            network = TransducerNetwork.from_nemo(checkpoint.config, sd, checkpoint.path)
            del checkpoint.state_dict, sd
        self._setup(checkpoint.path, checkpoint.config, checkpoint.tokenizer, network, preprocessor, device,
                    compute_type, use_graphs, buckets=buckets, steps_per_replay=steps_per_replay,
                    max_full_context_seconds=max_full_context_seconds, chunk_seconds=chunk_seconds,
                    chunk_context_seconds=chunk_context_seconds, chunk_batch=chunk_batch, decode_loop=decode_loop,
                    cpu_threads=cpu_threads)

    @classmethod
    def from_network(cls, network: TransducerNetwork, config: TransducerConfig, tokenizer, device: str = "auto",
                     compute_type: str = "auto", use_graphs: bool = True, **options) -> "TransducerModel":
        """A model from weights already in memory (benchmarks, conversions); options as for the constructor."""
        self = cls.__new__(cls)
        # the constructor's keyword-only defaults, written once there
        defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY}
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            raise InvalidOptionError(f"unknown TransducerModel option(s): {', '.join(unknown)}")
        self._setup("<in memory>", config, tokenizer, network, MelPreprocessor(config.preprocessor), device,
                    compute_type, use_graphs, **{**defaults, **options})
        return self

    def _setup(self, path, cfg: TransducerConfig, tokenizer, network: TransducerNetwork, preprocessor: MelPreprocessor,
               device, compute_type, use_graphs, *, buckets: Sequence[int], steps_per_replay: int,
               max_full_context_seconds: float, chunk_seconds: float, chunk_context_seconds: float, chunk_batch: int,
               decode_loop: str, cpu_threads: int) -> None:
        self.device = resolve_device(device)
        self.cpu_threads = set_cpu_threads(cpu_threads, self.device)
        self.dtype = resolve_dtype(compute_type, self.device)
        self.model_path = path
        self.config = cfg
        self._frame_time_table: List[float] = []  # round(frame * frame_seconds, 3), grown by _frame_times
        self.tokenizer = tokenizer
        self.preprocessor = place_module(preprocessor, self.device, torch.float32)
        self.network = place_module(network, self.device, self.dtype)
        if cpu_linear.in_major_preferred(self.device):  # a label step's few rows run fastest so there
            prednet, joint = self.network.prednet, self.network.joint
            cpu_linear.store_in_major([*prednet.weights, joint.pred.weight, joint.out.weight])
        self.decoder = LabelLoopingDecoder(
            self.network.prednet, self.network.joint, cfg.blank_id, cfg.durations, self.device,
            use_graphs=use_graphs, buckets=buckets, steps_per_replay=steps_per_replay, decode_loop=decode_loop,
        )
        factor = cfg.encoder.subsampling_factor
        frames_per_second = cfg.preprocessor.sample_rate / cfg.preprocessor.hop_length
        self.max_full_context_frames = int(max_full_context_seconds * frames_per_second)
        self.chunk_frames = max(factor, int(chunk_seconds * frames_per_second) // factor * factor)
        self.chunk_context_frames = int(chunk_context_seconds * frames_per_second) // factor * factor
        self.chunk_batch = max(1, int(chunk_batch))

    # -- properties ----------------------------------------------------------------------------
    @property
    def is_tdt(self) -> bool:
        return self.config.is_tdt

    @property
    def sample_rate(self) -> int:
        return self.config.preprocessor.sample_rate

    @property
    def frame_seconds(self) -> float:
        return self.config.frame_seconds

    def memory_report(self):
        return memory_report(self.network, self.decoder.nbytes(), self.device)

    # -- stages --------------------------------------------------------------------------------
    # samples per preprocessor call: its float32 spectrogram intermediates take ~50 bytes per sample,
    # so inputs of an hour or more are turned into features a few at a time (rows are independent)
    feature_call_samples = 1 << 26

    @torch.inference_mode()
    def features(self, audios: Sequence[np.ndarray]) -> Tuple[Tensor, Tensor]:
        """Mel features [B, n_mels, T] (float32) and their lengths for 1-D sample arrays.

        On CUDA the samples go up through pinned memory, one copy per call. Raises ``AudioError``
        naming the first input that holds NaN or infinite samples."""
        feats, lengths, finite = self._features(audios)
        self._check_finite(finite, range(len(audios)))
        return feats, lengths

    def _features(self, audios: Sequence[np.ndarray]) -> Tuple[Tensor, Tensor, Tensor]:
        """``features`` without waiting for the device: also each row's all-finite flag [B] (bool),
        for the caller to read when it next synchronises anyway."""
        sizes = [int(a.shape[0]) for a in audios]
        calls = self._feature_calls(list(range(len(audios))), sizes)
        if len(calls) == 1:
            return self._preprocess(self._upload(audios), sizes)
        out = lengths = None
        finite = torch.ones(len(audios), dtype=torch.bool, device=self.device)
        for rows, index in zip(calls, self._device_indices(calls)):
            feats, feat_len, ok = self._preprocess(self._upload([audios[i] for i in rows]), [sizes[i] for i in rows])
            if out is None:  # the first call has the longest rows: its width is the batch's
                out = feats.new_full((len(audios),) + feats.shape[1:], self.config.preprocessor.pad_value)
                lengths = feat_len.new_zeros(len(audios))
            out[index, :, : feats.shape[-1]] = feats
            lengths[index] = feat_len
            finite[index] = ok
        return out, lengths, finite

    def _feature_calls(self, rows: List[int], sizes: List[int]) -> List[List[int]]:
        """``rows`` in preprocessor calls of at most ``feature_call_samples`` padded samples (longest
        first when there are several; as given when one call holds them all)."""
        if max(sizes[i] for i in rows) * len(rows) <= self.feature_call_samples:
            return [rows]
        calls, current, width = [], [], 0
        for i in sorted(rows, key=lambda i: -sizes[i]):
            width = max(width, sizes[i]) if current else sizes[i]
            if current and width * (len(current) + 1) > self.feature_call_samples:
                calls.append(current)
                current, width = [], sizes[i]
            current.append(i)
        calls.append(current)
        return calls

    def _preprocess(self, batch: Tensor, sizes: List[int]) -> Tuple[Tensor, Tensor, Tensor]:
        """Features, lengths and all-finite flags of a padded sample batch on the device (no waiting)."""
        feats, lengths = self.preprocessor(batch, host_values_to_device(sizes, self.device))
        return feats, lengths, torch.isfinite(batch).all(dim=1)

    @staticmethod
    def _check_finite(finite: Tensor, inputs: Sequence[int]) -> None:
        """Raise ``AudioError`` for the first row whose flag is false (``inputs``: the rows' input numbers)."""
        if not bool(finite.all()):
            bad = inputs[int(torch.nonzero(~finite)[0])]
            raise AudioError(f"audio input {bad} contains NaN or infinite samples")

    def _upload(self, audios: Sequence[np.ndarray]) -> Tensor:
        """The padded batch [B, N] float32 on the device, from one (pinned) host buffer in one copy."""
        pinned = self.device.type == "cuda"
        return padded_host_batch(audios, pinned).to(self.device, non_blocking=pinned)

    @torch.inference_mode()
    def encode(self, features: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        """features [B, n_mels, T] -> encoder output [B, T', d_model] in the compute dtype, lengths.

        Rows up to ``max_full_context_frames`` are encoded whole (in length groups); longer rows in
        overlapping windows, the windows of all long rows batched together. Either way a row's output
        is the one it gets alone."""
        features = features.to(self.device)
        host = [int(n) for n in lengths.tolist()]
        long_rows = [i for i, n in enumerate(host) if n > self.max_full_context_frames]
        with strict_float32(self.device, self.dtype):
            if not long_rows:
                return self._encode_grouped(features, lengths, host)
            outs = dict(zip(long_rows, self._encode_windowed(features, [(i, host[i]) for i in long_rows])))
            short_rows = [i for i in range(len(host)) if i not in outs]
            if short_rows:
                width = max(host[i] for i in short_rows)
                index = self._device_indices([short_rows])[0]
                enc, enc_len = self._encode_grouped(features[index, :, :width], lengths.to(self.device)[index],
                                                    [host[i] for i in short_rows])
                for j, i in enumerate(short_rows):
                    outs[i] = enc[j, : int(enc_len[j])]
        width = max(out.shape[0] for out in outs.values())
        first = outs[long_rows[0]]
        enc = first.new_zeros(len(host), width, first.shape[-1])
        for i, out in outs.items():
            enc[i, : out.shape[0]] = out
        out_lengths = torch.tensor([outs[i].shape[0] for i in range(len(host))], dtype=torch.int64, device=self.device)
        return enc, out_lengths

    @torch.inference_mode()
    def _encode_samples(self, samples: Sequence[np.ndarray], inputs: Optional[Sequence[int]] = None
                        ) -> Tuple[Tensor, Tensor]:
        """Encoder output [B, T', d_model] and lengths for sample arrays, length group by length group:
        the host fills and uploads one group's samples while the device encodes the one before (the
        same rows and widths as ``encode(*features(samples))``, so the same results). ``inputs``: the
        caller's number for each array, for the error naming a non-finite one."""
        inputs = range(len(samples)) if inputs is None else inputs
        frames = [int(a.shape[0]) // self.config.preprocessor.hop_length for a in samples]  # feature_lengths
        if max(frames) > self.max_full_context_frames:
            feats, lengths, finite = self._features(samples)
            self._check_finite(finite, inputs)
            return self.encode(feats, lengths)
        sizes = [int(a.shape[0]) for a in samples]
        # the group with the fewest samples first (only its upload finds the device idle), each group
        # in preprocessor calls; the uploads run ahead of the encoder on a worker thread and a side stream
        groups = [self._feature_calls(rows, sizes)
                  for rows in sorted(self._length_groups(frames), key=lambda g: sum(frames[i] for i in g))]
        # features too on the side stream: the preprocessor of one call runs beside the encoder of the last
        prepared = upload_batches([[samples[i] for i in call] for calls in groups for call in calls], self.device,
                                  prepare=lambda batch, arrays: self._preprocess(batch, [a.shape[0] for a in arrays]))
        pad_value = self.config.preprocessor.pad_value
        outs, checks = [], []
        factor = self.config.encoder.subsampling_factor
        with strict_float32(self.device, self.dtype):
            for calls in groups:
                rows = [i for call in calls for i in call]
                width = max(1, max(frames[i] for i in rows))
                parts = [next(prepared) for _ in calls]
                feats = torch.cat([F.pad(f[:, :, :width], (0, max(0, width - f.shape[-1])), value=pad_value)
                                   for f, _, _ in parts]) if len(parts) > 1 else parts[0][0][:, :, :width]
                lengths = torch.cat([n for _, n, _ in parts]) if len(parts) > 1 else parts[0][1]
                padded = subsampled_length(min(frames[i] for i in rows), factor) < subsampled_length(width, factor)
                out, out_len = self.network.encoder(feats, lengths, padded=padded,
                                                    host_lengths=[frames[i] for i in rows])
                outs.append((rows, out, out_len))
                checks.append((rows, torch.cat([ok for _, _, ok in parts])))
        for rows, finite in checks:
            self._check_finite(finite, [inputs[i] for i in rows])
        if len(outs) == 1:
            _, enc, enc_len = outs[0]
            return enc, enc_len
        return self._gather_groups(len(samples), outs)

    def _gather_groups(self, batch: int, outs: List[Tuple[List[int], Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
        """One padded [batch, T', d_model] output (and lengths) from groups' (rows, output, lengths)."""
        width = max(out.shape[1] for _, out, _ in outs)
        enc = outs[0][1].new_zeros(batch, width, outs[0][1].shape[-1])
        enc_len = torch.zeros(batch, dtype=torch.int64, device=self.device)
        for (_, out, out_len), index in zip(outs, self._device_indices([rows for rows, _, _ in outs])):
            enc[index, : out.shape[1]] = out
            enc_len[index] = out_len
        return enc, enc_len

    def _device_indices(self, groups: List[List[int]]) -> List[Tensor]:
        """Each group's row numbers as a device tensor, all from one copy that does not wait for the
        device (else the GPU idles while the next group's first kernels are launched)."""
        flat = host_values_to_device([i for rows in groups for i in rows], self.device)
        return list(flat.split([len(rows) for rows in groups]))

    # a group's fixed cost, in encoder frames: launches, and small products that fill the GPU less
    group_overhead_frames = 2000

    def _length_groups(self, lengths: List[int]) -> List[List[int]]:
        """Rows in groups of similar length (longest first), each encoded as one batch of its longest.

        On the kernel path the per-frame work (linears, norms, activations) runs on the rows' own
        frames only; what grows with a group's longest row T is the attention per frame (its position
        scores are T wide: measured about T / 2850 of the rest on an H100) and the subsampling, which
        runs padded (about 0.07 of a frame's work per padded frame). Minimizes that plus a fixed
        ``group_overhead_frames`` per group; exact dynamic programme over the sorted lengths.
        """
        factor = self.config.encoder.subsampling_factor
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        sub = [max(1, -(-lengths[i] // factor)) for i in order]
        n = len(sub)
        total = [0] * (n + 1)
        for k, t in enumerate(sub):
            total[k + 1] = total[k] + t
        best = [0.0] + [math.inf] * n
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j):
                t = sub[i]
                frames = total[j] - total[i]
                cost = best[i] + frames * (1.0 + t / 2850.0) + 0.07 * (j - i) * t + self.group_overhead_frames
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        groups = []
        j = n
        while j > 0:
            groups.append(order[cut[j]:j])
            j = cut[j]
        return groups[::-1]

    def _encode_grouped(self, features: Tensor, lengths: Tensor, host: List[int]) -> Tuple[Tensor, Tensor]:
        """The encoder over length groups (rows are independent: padding only costs time); ``host``: the
        lengths on the host."""
        lengths = lengths.to(self.device)
        groups = self._length_groups(host)
        if len(groups) == 1:
            return self.network.encoder(features[:, :, : max(1, max(host))], lengths, host_lengths=host)
        outs = []
        for rows, index in zip(groups, self._device_indices(groups)):
            width = max(1, max(host[i] for i in rows))
            out, out_len = self.network.encoder(features[index, :, :width], lengths[index],
                                                host_lengths=[host[i] for i in rows])
            outs.append((rows, out, out_len))
        return self._gather_groups(features.shape[0], outs)

    def _encode_windowed(self, features: Tensor, rows: List[Tuple[int, int]]) -> List[Tensor]:
        """Long rows (index, valid frames) of ``features`` [B, n_mels, T]: overlapping windows of every
        row encoded ``chunk_batch`` at a time, each row's window centres stitched -> [T', d_model] per row."""
        factor = self.config.encoder.subsampling_factor
        chunk, context = self.chunk_frames, self.chunk_context_frames
        windows = []  # (row, start, end, a, b): [start, end) kept, [a, b) encoded
        for row, total in rows:
            for start in range(0, total, chunk):
                end = min(start + chunk, total)
                windows.append((row, start, end, max(0, start - context), min(total, end + context)))
        pieces: Dict[int, List[Tuple[int, Tensor]]] = {row: [] for row, _ in rows}
        order = sorted(range(len(windows)), key=lambda k: -(windows[k][4] - windows[k][3]))  # similar widths together
        for first in range(0, len(order), self.chunk_batch):
            group = [windows[k] for k in order[first:first + self.chunk_batch]]
            width = max(b - a for *_, a, b in group)
            batch = features.new_zeros(len(group), features.shape[1], width)
            for j, (row, _, _, a, b) in enumerate(group):
                batch[j, :, : b - a] = features[row, :, a:b]
            lengths = torch.tensor([b - a for *_, a, b in group], dtype=torch.int64, device=features.device)
            out, _ = self.network.encoder(batch, lengths, host_lengths=[b - a for *_, a, b in group])
            for j, (row, start, end, a, _) in enumerate(group):
                skip = (start - a) // factor
                keep = -(-(end - start) // factor)
                pieces[row].append((start, out[j, skip:skip + keep]))
        return [torch.cat([piece for _, piece in sorted(pieces[row], key=lambda x: x[0])]) for row, _ in rows]

    # -- transcription -------------------------------------------------------------------------
    def _load(self, audio: AudioInput) -> np.ndarray:
        # finiteness is checked on the device, with the upload (a host pass over every sample costs
        # more than the encoder's first layer at large batches)
        return load_audio(audio, self.sample_rate, check_finite=False)

    def _result(self, hyp: Hypothesis, samples: int) -> TransducerResult:
        fs = self.frame_seconds
        return TransducerResult(
            text=self.tokenizer.decode(hyp.tokens),
            tokens=hyp.tokens,
            frames=hyp.frames,
            durations=hyp.durations,
            timestamps=self._frame_times(hyp.frames),
            audio_duration=samples / self.sample_rate,
            frame_seconds=fs,
        )

    def _frame_times(self, frames: List[int]) -> List[float]:
        """Each frame's start in seconds, to the millisecond, from a table grown as needed (rounding
        every token's time took most of the time of building a batch's results)."""
        table = self._frame_time_table
        if frames and max(frames) >= len(table):
            fs = self.frame_seconds
            table.extend(round(f * fs, 3) for f in range(len(table), 2 * max(frames) + 1))
        return [table[f] for f in frames]

    def _check_max_symbols(self, max_symbols: Optional[int]) -> int:
        if max_symbols is None:
            return self.config.max_symbols
        check_max_symbols(max_symbols)
        return max_symbols

    def options(self, **kwargs) -> dict:
        """The keyword options of ``transcribe`` checked: ``max_symbols`` is the only one; any other
        (a beam size, say) raises ``InvalidOptionError`` naming it, never silently ignored."""
        unknown = sorted(set(kwargs) - {"max_symbols"})
        if unknown:
            raise InvalidOptionError(f"a transducer model takes max_symbols only, not {', '.join(unknown)}")
        if kwargs.get("max_symbols") is not None:
            check_max_symbols(kwargs["max_symbols"])
        return kwargs

    def transcribe(self, audio: AudioInput, max_symbols: Optional[int] = None) -> TransducerResult:
        """Greedy transcription of one input (a path, bytes, or 16-kHz samples)."""
        return self.transcribe_batch([audio], batch_size=1, max_symbols=max_symbols)[0]

    def transcribe_batch(
        self, audios: Sequence[AudioInput], batch_size: int = 16, max_symbols: Optional[int] = None
    ) -> List[TransducerResult]:
        """Greedy transcription of several inputs, ``batch_size`` at a time; results in input order.

        Each input's result is the same as transcribing it alone: padding is masked everywhere.
        """
        max_symbols = self._check_max_symbols(max_symbols)
        check_positive_int("batch_size", batch_size)
        samples = [self._load(a) for a in audios]
        hyps = self._decode_samples(samples, batch_size, max_symbols)
        return [self._result(hyp, x.shape[0]) for hyp, x in zip(hyps, samples)]

    @torch.inference_mode()
    def _decode_samples(self, samples: List[np.ndarray], batch_size: int, max_symbols: int) -> List[Hypothesis]:
        """Encode ``batch_size`` inputs at a time, longest first, and decode them on the row scheduler:
        while the decoder works on one group's utterances the next group is encoded, and a row whose
        utterance ended takes the next waiting one at once."""
        if not samples:
            return []
        order = sorted(range(len(samples)), key=lambda i: -samples[i].shape[0])  # similar lengths together
        groups = [order[first:first + batch_size] for first in range(0, len(order), batch_size)]
        results: List[Optional[Hypothesis]] = [None] * len(samples)
        run = None
        scheduler = RowScheduler(lambda _: run)
        for ids in groups:
            enc, enc_len = self._encode_samples([samples[i] for i in ids], ids)
            if run is None:  # the longest inputs come first: their frames size the run
                rows = self.decoder.bucket(min(batch_size, len(samples)))
                run = self.decoder.open_run(rows, max(enc.shape[1], 1), max_symbols)
            for j, (i, n) in enumerate(zip(ids, enc_len.tolist())):
                scheduler.submit(max_symbols, Utterance(enc[j], int(n)), store_at(results, i))
            with strict_float32(self.device, self.dtype):
                while scheduler.waiting:  # admit this group; rows still busy go on with the next
                    scheduler.step()
        with strict_float32(self.device, self.dtype):
            scheduler.run_until_idle()
        return results  # type: ignore[return-value]

    # -- segments (the command line and the transcript writers) --------------------------------
    def segments(self, result: TransducerResult, max_gap_seconds: float = 1.0, max_segment_seconds: float = 30.0):
        """Whisper-style segments from token times: split after . ? ! and at long pauses or length."""

        fs = result.frame_seconds
        tokens = result.tokens
        segments: List[Segment] = []
        if not tokens:
            return segments

        def token_end(k: int) -> float:
            span = result.durations[k] if result.durations is not None else 1
            return (result.frames[k] + max(1, span)) * fs

        group: List[int] = []

        def close():
            if not group:
                return
            ids = [tokens[k] for k in group]
            start = result.frames[group[0]] * fs
            end = max(token_end(group[-1]), start)
            end = min(end, result.audio_duration) if result.audio_duration > start else end
            segments.append(Segment(
                id=len(segments) + 1, seek=int(round(start * FRAMES_PER_SECOND)), start=round(start, 3), end=round(end, 3),
                text=" " + self.tokenizer.decode(ids).strip(), tokens=ids, avg_logprob=0.0,
                compression_ratio=0.0, no_speech_prob=0.0, words=None, temperature=0.0,
            ))
            group.clear()

        for k in range(len(tokens)):
            if group and self.tokenizer.starts_word(tokens[k]):
                gap = result.frames[k] * fs - token_end(group[-1])
                length = result.frames[k] * fs - result.frames[group[0]] * fs
                if gap >= max_gap_seconds or length >= max_segment_seconds:
                    close()
            group.append(k)
            if self.tokenizer.id_to_piece(tokens[k]).rstrip().endswith((".", "?", "!")):
                close()
        close()
        return segments

    def transcribe_segments(self, audio: AudioInput, **options):
        """(segments iterator, info) like ``WhisperModel.transcribe``, for the CLI and the writers;
        ``options`` as ``options`` checks them (``max_symbols`` only)."""
        max_symbols = self.options(**options).get("max_symbols")
        result = self.transcribe(audio, max_symbols=max_symbols)
        info = TranscriptionInfo(
            language="und", language_probability=1.0, duration=result.audio_duration,
            transcription_options={"max_symbols": max_symbols or self.config.max_symbols, "decoding": "greedy label looping"},
        )
        return iter(self.segments(result)), info
