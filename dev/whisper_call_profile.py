"""Where a whole Whisper decode call's time goes beyond its steps, on the device-loop rung (GPU).

    PYTHONPATH=src:dev python dev/whisper_call_profile.py [--sizes tiny large-v3] [--batches 1 16] [--steps 64]

For each (size, batch), random float16 weights, end-of-text suppressed so every row runs ``--steps``
steps: the steady ms per step (one device-loop launch alone) against one whole ``decode`` call divided
by the steps (bench/whisper_gpu.py's "per call"), then one call under the profiler: the wall time, the
GPU's busy time and its idle gaps (when the host held the GPU up), the host ops during the largest gap,
and cProfile's heaviest Python functions over repeated warm calls (what the host does per call). The
profiler (torch 2.11 on an H100) did not record the kernels inside the device loop's while node: there
the loop itself shows as one long gap, the host waiting in cudaEventSynchronize.
``--beam K``: beam search of K beams instead, on the device loop beside the K-step rung (graphs per
cache-length bucket): the first call (its captures) and the warm call of each, and the captured keys.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ostinato.models.whisper.decoding import SearchOptions, WindowDecoder, window_jobs
from ostinato.testing.random_models import forced_requests, random_whisper, whisper_tokenizer
from transducer_stages import busy_intervals, idle_gaps, largest_gap_host_ops


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def steady_ms(decoder, features, requests, suppress, steps: int, repeats: int) -> float:
    """ms per step of one device-loop launch that runs every row ``steps`` steps."""
    times = []
    for _ in range(repeats):
        run = decoder.start(SearchOptions(), suppress, [], len(requests))
        run.admit(window_jobs(features, requests))
        sync()
        times.append(wall_ms(run.advance, 1))
        run.collect()
    return statistics.median(times) / steps


def gap_report(call) -> str:
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        call()
        sync()
        wall = (time.perf_counter() - t0) * 1e3
    busy = busy_intervals(prof)
    on = sum(e - s for s, e in busy) / 1e3
    gaps = idle_gaps(busy)
    lines = [f"  profiled call: wall {wall:.2f} ms (profiler on), GPU busy {on:.2f} ms, idle gaps sum "
             f"{sum(g for g, _ in gaps):.2f} ms over {len(gaps)}; largest (ms@ms): "
             + ", ".join(f"{g:.2f}@{at:.1f}" for g, at in gaps[::-1][:10])]
    _, ops = largest_gap_host_ops(prof, busy)
    if ops:
        lines.append("  host ops in the largest gap: " + ", ".join(f"{name} {ms:.2f}" for name, ms in ops[:12]))
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50)
    lines.append(table)
    return "\n".join(lines)


def python_report(call, calls: int, top: int) -> str:
    profiler = cProfile.Profile()
    sync()
    profiler.enable()
    for _ in range(calls):
        call()
    sync()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return f"  cProfile over {calls} calls (times are totals):\n" + "\n".join(
        line for line in out.getvalue().splitlines() if line.strip() and "function calls" not in line)


def beam_report(model, tok, device, batch: int, beams: int, steps: int, repeats: int) -> str:
    features = model.encoder(torch.randn(batch, model.dims.n_mels, 3000, device=device,
                                         dtype=model.decoder.token_embedding.weight.dtype))
    requests, suppress = forced_requests(tok, batch, steps)
    options = SearchOptions(beam_size=beams)
    lines = []
    for rung in ("auto", "kstep") if device.type == "cuda" else ("auto",):
        decoder = WindowDecoder(model, tok, device, buckets=(batch,), capacity=batch * beams, windows=batch,
                                decode_loop=rung)
        call = lambda: decoder.decode(features, requests, suppress, [], options)  # noqa: E731
        first = wall_ms(call, 1)
        results = call()
        assert all(len(r.tokens) == steps for r in results), [len(r.tokens) for r in results]
        warm = wall_ms(call, repeats)
        graph = decoder.beam.graph
        keys = graph.captured_keys()
        lines.append(f"  beam {beams}, {rung} ({decoder.decode_loop}): first call {first:.0f} ms, warm {warm:.2f} ms = "
                     f"{warm / steps:.3f} ms/step; {len(keys)} graphs: {sorted({graph.rung(k) for k in keys})}")
        decoder = None
    return "\n".join(lines)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "large-v3"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-python", action="store_true", help="skip the cProfile report")
    ap.add_argument("--beam", type=int, default=0, help="beam search of this many beams, both rungs")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (float32)")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}", flush=True)
    for size in args.sizes:
        model = random_whisper(size, device, dtype)
        tok = whisper_tokenizer(model.dims.n_vocab)
        for batch in args.batches:
            if args.beam:
                print(f"== {size} B={batch}, beam search\n" + beam_report(model, tok, device, batch, args.beam,
                                                                           args.steps, args.repeats), flush=True)
                continue
            decoder = WindowDecoder(model, tok, device, buckets=(batch,))
            features = model.encoder(torch.randn(batch, model.dims.n_mels, 3000, device=device, dtype=dtype))
            requests, suppress = forced_requests(tok, batch, args.steps)
            call = lambda: decoder.decode(features, requests, suppress, [])  # noqa: E731
            results = call()  # captures
            assert all(len(r.tokens) == args.steps for r in results), [len(r.tokens) for r in results]
            call_ms = wall_ms(call, args.repeats)
            step = steady_ms(decoder, features, requests, suppress, args.steps, args.repeats)
            print(f"== {size} B={batch} ({decoder.decode_loop} loop): "
                  f"step {step:.3f} ms; call {call_ms:.2f} ms = {call_ms / args.steps:.3f} ms/step = "
                  f"{call_ms / args.steps / step:.2f}x the step; beyond the steps {call_ms - step * args.steps:.2f} ms",
                  flush=True)
            print(gap_report(call), flush=True)
            if not args.no_python:
                print(python_report(call, 20, args.top), flush=True)
            decoder = None
        model = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
