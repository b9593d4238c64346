"""Whisper decoding on a GPU: ostinato beside HF transformers and openai-whisper, on the same weights.

    PYTHONPATH=src:.carry/pylib python bench/whisper_gpu.py [--sizes tiny small large-v3]
        [--batches 1 16] [--steps 64] [--repeats 5] [--out DIR] [--e2e-model PATH --clips DIR]

For each model size (random float16 weights, one set shared by all three implementations) and
batch size, one run on one machine prints the decode ms per step of:
  * ostinato, steady state: the decode loop alone (one device while-loop launch that runs until
    the rows finish, or on the rung below, replays of K unrolled steps), the per-step cost the
    targets speak of; and per call: one whole decode call from the encoder output (prefill,
    cross-attention K/V, the steps, results) divided by the steps, as the peers are timed;
  * the same steady state on the K-step rung (device loop off), to show what the loop gives;
  * ostinato without its Triton kernels (plain PyTorch in the same graphs), to show what they give;
  * HF transformers' eager ``generate`` and openai-whisper's ``decode`` (bench/whisper_peers.py);
  * the bandwidth floor: bytes a step must read (weights + cross-attention K/V) over the measured
    copy bandwidth.
Every decode is forced to ``--steps`` tokens (end-of-text suppressed). Medians over repeats. Also:
peak GPU memory against weights + decoder state, the large-v3 encoder's share of the measured
matmul rate at batch 16, a PNG of ms/step against batch size, and with ``--e2e-model`` the
audio-seconds per second of ``transcribe_batch`` over 64 clips against one-by-one ``transcribe``
(with a check that both give the same text).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

import whisper_peers as peers  # noqa: E402

from ostinato.models.whisper.decoding import GreedyKey, WindowDecoder, WindowRequest, window_jobs  # noqa: E402
from ostinato.models.whisper.loaders.vocab import vocabulary_layout, whisper_tokenizer_file  # noqa: E402
from ostinato.models.whisper.modules import Whisper, fused_step_supported  # noqa: E402
from ostinato.models.whisper.tokenizer import WhisperTokenizer  # noqa: E402
from ostinato.runtime import storage_bytes  # noqa: E402
from ostinato.testing.random_models import random_mel, random_whisper_checkpoint  # noqa: E402


def _events_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


class OstinatoBench:
    """ostinato's decoder on a random checkpoint, timed per replay and per call."""

    def __init__(self, dims, state_dict, device, steps_per_replay=None):
        self.dims = dims
        self.steps_per_replay = steps_per_replay  # None: the decoder's own choice
        self.model = Whisper.from_state_dict(dims, state_dict).to(device).eval().requires_grad_(False)
        multilingual, languages = vocabulary_layout(dims.n_vocab)
        self.tokenizer = WhisperTokenizer(whisper_tokenizer_file(dims.n_vocab), multilingual, languages)
        self.ids = peers.special_ids(dims)
        self.device = device
        if fused_step_supported(device, torch.float16, dims.n_text_state // dims.n_text_head):
            # What the first decoder would do; done here so that every measurement sees the same weights.
            self.model.decoder.pack_self_attention()

    def requests(self, batch: int, steps: int):
        request = WindowRequest(list(self.ids.prompt), timestamps=False, max_initial_timestamp_index=50,
                                max_new_tokens=steps)
        return [request] * batch

    @torch.inference_mode()
    def measure(self, batch: int, steps: int, repeats: int, triton: bool, device_loop: bool = True) -> dict:
        os.environ["OSTINATO_NO_TRITON"] = "0" if triton else "1"
        gc.collect()  # earlier decoders (reference cycles through their step graphs) and their graph pools
        torch.cuda.empty_cache()
        weights = storage_bytes(list(self.model.decoder.parameters()) + list(self.model.encoder.parameters()))
        # Tensors alive now that are not the model's weights (the checkpoint's q/k/v tensors that packing
        # replaced, held for the peers) are not ostinato's: the peak below is counted without them.
        outside = torch.cuda.memory_allocated() - weights
        decoder = WindowDecoder(self.model, self.tokenizer, self.device, buckets=(batch,),
                                 steps_per_replay=self.steps_per_replay,
                                 decode_loop="auto" if device_loop else "kstep")
        features = self.model.encoder(random_mel(self.dims, batch).to(self.device, torch.float16))
        torch.cuda.reset_peak_memory_stats()  # the decode phase only: the encoder's activations are gone
        suppress = list(self.ids.suppress)
        decode = lambda: decoder.decode(features, self.requests(batch, steps), suppress, [])  # noqa: E731
        results = decode()  # capture and warm-up
        held = torch.cuda.memory_allocated() - outside  # weights, state, features + what capture keeps
        if sorted({len(r.tokens) for r in results}) != [steps]:
            raise RuntimeError(f"forced length not reached: {sorted({len(r.tokens) for r in results})}")
        per_call = _events_ms(decode, repeats) / steps
        step = self._steady_ms(decoder, features, batch, steps, repeats)
        row = dict(step_ms=step, call_ms=per_call, peak=torch.cuda.max_memory_allocated() - outside, held=held,
                   weights=weights, state=decoder.nbytes(), features=features.numel() * features.element_size(),
                   mode=decoder.graph.rung(GreedyKey(batch)))
        os.environ.pop("OSTINATO_NO_TRITON", None)
        return row

    def _steady_ms(self, decoder, features, batch: int, steps: int, repeats: int) -> float:
        """ms per step of the decode loop alone, rows active throughout, without prefill or results."""
        from ostinato.models.whisper.decoding import SearchOptions

        suppress = list(self.ids.suppress)
        if decoder.graph.rung(GreedyKey(batch)) != "device loop":
            # Replays of K unrolled steps; the rows' budget outlasts every replay timed.
            run = decoder.start(SearchOptions(), suppress, [], batch)
            run.admit(window_jobs(features, self.requests(batch, 448 - 8)))
            replays = max(1, steps // decoder.steps_per_replay)
            ms = _events_ms(lambda: [run.advance() for _ in range(replays)], repeats)
            return ms / (replays * decoder.steps_per_replay)
        # One launch runs until a row finishes: admit rows that all finish after exactly ``steps``.
        times = []
        for _ in range(repeats):
            run = decoder.start(SearchOptions(), suppress, [], batch)
            run.admit(window_jobs(features, self.requests(batch, steps)))
            times.append(_events_ms(run.advance, 1))
            lengths = {len(r.tokens) for r in run.collect().values()}
            if lengths != {steps} or run.busy:
                raise RuntimeError(f"one device-loop launch should run every row {steps} steps: {sorted(lengths)}")
        return statistics.median(times) / steps

    @torch.inference_mode()
    def encoder_ms(self, batch: int, repeats: int) -> float:
        mel = random_mel(self.dims, batch).to(self.device, torch.float16)
        self.model.encoder(mel)
        return _events_ms(lambda: self.model.encoder(mel), repeats)


def e2e(model_path: str, clips_dir: str, batch_size: int, repeats: int) -> dict:
    from ostinato import WhisperModel

    clips = peers.e2e_clips(clips_dir, 64)
    audio_seconds = sum(len(c) for c in clips) / 16000
    model = WhisperModel(model_path, device="cuda", compute_type="float16")
    texts_batch = None

    def batched():
        nonlocal texts_batch
        texts_batch = [[s.text for s in segs] for segs, _ in model.transcribe_batch(clips, batch_size=batch_size)]

    def one_by_one():
        return [[s.text for s in model.transcribe(c)[0]] for c in clips]

    batched()
    differing = [i for i, (a, b) in enumerate(zip(texts_batch, one_by_one())) if a != b]
    print(f"e2e: clips whose batched text differs from one by one: {differing}", flush=True)

    batched()  # graphs captured
    one = one_by_one()
    t_batch = statistics.median(_wall(batched) for _ in range(repeats))
    t_one = _wall(one_by_one)
    return dict(audio_seconds=audio_seconds, batch_rate=audio_seconds / t_batch, one_rate=audio_seconds / t_one,
                same=texts_batch == one, clips=len(clips), batch_size=batch_size)


def _wall(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small", "large-v3"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--sweep", nargs="+", type=int, default=[1, 2, 4, 8, 16],
                        help="batch sizes of ostinato's line in the plot")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--steps-per-replay", type=int, default=None, help="default: the decoder's own choice")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peer-repeats", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--out", default="out")
    parser.add_argument("--e2e-model", default=None)
    parser.add_argument("--clips", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    copy_gbs = peers.copy_bandwidth_gbs(device)
    tflops = peers.matmul_tflops(device)
    print(f"device: {name}; torch {torch.__version__}; copy {copy_gbs:.0f} GB/s (read+write); "
          f"fp16 matmul {tflops:.0f} TFLOP/s", flush=True)
    rows, plot_rows, memory, encoder = [], [], [], {}
    for size in args.sizes:
        dims, state_dict = random_whisper_checkpoint(size, device="cuda")
        bench = OstinatoBench(dims, state_dict, device, args.steps_per_replay)
        for batch in sorted(set(args.batches) | set(args.sweep)):
            try:
                fused = bench.measure(batch, args.steps, args.repeats, triton=True)
            except Exception as exc:  # a kernel that fails here must not hide the rest of the table
                print(f"ostinato with Triton failed for {size} B={batch}: {type(exc).__name__}: {exc}", flush=True)
                fused = bench.measure(batch, args.steps, args.repeats, triton=False)
            plot_rows.append((size, "ostinato", batch, fused["step_ms"]))
            memory.append((size, batch, fused))
            if batch not in args.batches:
                continue
            plain = bench.measure(batch, args.steps, args.repeats, triton=False)
            unrolled = bench.measure(batch, args.steps, args.repeats, triton=True, device_loop=False)
            row = dict(size=size, batch=batch, step=fused["step_ms"], call=fused["call_ms"], plain=plain["step_ms"],
                       unrolled=unrolled["step_ms"], unrolled_call=unrolled["call_ms"], rung=fused["mode"],
                       floor=peers.bandwidth_floor_ms(dims, batch, 2, copy_gbs))
            if not args.no_peers:
                row["hf"] = peers.hf_ms_per_step(dims, state_dict, batch, args.steps, args.peer_repeats, device, torch.float16)
                torch.cuda.empty_cache()
                row["openai"] = peers.openai_ms_per_step(dims, state_dict, batch, args.steps, args.peer_repeats, device,
                                                         torch.float16)
                torch.cuda.empty_cache()
                for impl in ("hf", "openai"):
                    plot_rows.append((size, impl, batch, row[impl]))
            rows.append(row)
            print(json.dumps(row), flush=True)
        if size.startswith("large"):
            ms = bench.encoder_ms(16, args.repeats)
            encoder = dict(size=size, batch=16, ms=ms, tflops=peers.encoder_flops(dims, 16) / ms / 1e9, peak_tflops=tflops)
        del bench, state_dict
        torch.cuda.empty_cache()

    e2e_row = e2e(args.e2e_model, args.clips, 16, 3) if args.e2e_model and args.clips else None

    print(f"\n== decode ms per step on {name}, float16, random weights, {args.steps} forced steps; medians ==")
    print(f"(ostinato step / per call: on the {rows[0]['rung'] if rows else '?'} rung; K-step: the same with the "
          f"device loop off)")
    header = f"{'model':<9}{'B':>4}{'ostinato step':>15}{'per call':>10}{'K-step':>8}{'its call':>10}" \
             f"{'no Triton':>11}{'HF generate':>13}{'openai-whisper':>16}{'floor':>8}{'vs HF':>8}"
    print(header)
    for r in rows:
        hf, ow = r.get("hf", float("nan")), r.get("openai", float("nan"))
        print(f"{r['size']:<9}{r['batch']:>4}{r['step']:>15.3f}{r['call']:>10.3f}{r['unrolled']:>8.3f}"
              f"{r['unrolled_call']:>10.3f}{r['plain']:>11.3f}{hf:>13.2f}{ow:>16.2f}{r['floor']:>8.3f}"
              f"{hf / r['call']:>7.0f}x")
    print("\n== peak GPU memory (decode phase) ==")
    for size, batch, m in memory:
        budget = m["weights"] + m["state"] + m["features"]
        print(f"{size:<9}B={batch:<3} peak {m['peak'] / 2**20:9.1f} MiB; weights {m['weights'] / 2**20:8.1f} + state "
              f"{m['state'] / 2**20:8.1f} + encoder output {m['features'] / 2**20:6.1f} MiB; "
              f"peak / that = {m['peak'] / budget:.3f}; held between calls {m['held'] / budget:.3f} ({m['mode']})")
    if encoder:
        print(f"\n== encoder {encoder['size']} batch {encoder['batch']}: {encoder['ms']:.1f} ms, {encoder['tflops']:.0f} "
              f"TFLOP/s = {100 * encoder['tflops'] / encoder['peak_tflops']:.0f}% of the measured matmul rate ==")
    if e2e_row:
        print(f"\n== end to end: {e2e_row['clips']} clips, {e2e_row['audio_seconds']:.0f} s of audio: transcribe_batch "
              f"(batch {e2e_row['batch_size']}) {e2e_row['batch_rate']:.0f} audio-s/s vs one by one "
              f"{e2e_row['one_rate']:.0f} audio-s/s; same text: {e2e_row['same']} ==")
    plot = peers.plot_ms_per_step(plot_rows, out / "whisper_ms_per_step.png", title=f"Whisper decode step, {name}, fp16")
    (out / "whisper_gpu.json").write_text(json.dumps(dict(device=name, rows=rows, encoder=encoder, e2e=e2e_row,
                                                          memory=[(s, b, m) for s, b, m in memory]), indent=1))
    print(f"plot: {plot}")


if __name__ == "__main__":
    main()
