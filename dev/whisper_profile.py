"""Where a Whisper decode step's time goes: kernels per step, grouped, on random weights (GPU).

    PYTHONPATH=src python dev/whisper_profile.py --sizes tiny large-v3 --batches 1 16 [--steps 64]

For each (size, batch), end-of-text suppressed so every row runs every step: ms per whole decode
call (median of repeats) and ms per step of steady graph replays; then the kernels of one step
(launches and time, the top ones) and of one whole call (prefill, cross-attention K/V, steps,
results), so a change can be judged by what it removes. ``--encoder large-v3`` also profiles that
encoder at batch 16 (its share of the matmul rate, and where its kernel time goes). Also prints which graph
features the installed PyTorch offers (device while-loops, conditional nodes).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from ostinato.models.whisper.decoding import WindowDecoder, window_jobs
from ostinato.testing.measure import matmul_tflops, whisper_encoder_flops
from ostinato.testing.random_models import forced_requests, random_whisper, whisper_tokenizer


def feature_report() -> str:
    graph = getattr(torch.cuda, "CUDAGraph", None)
    names = [n for n in dir(graph) if "while" in n.lower() or "cond" in n.lower() or "capture_to" in n.lower()]
    lines = [f"torch {torch.__version__}; CUDAGraph methods: {names}"]
    try:
        from cuda.bindings import runtime  # noqa: F401

        lines.append("cuda.bindings: present")
    except Exception as exc:  # noqa: BLE001
        lines.append(f"cuda.bindings: {type(exc).__name__}")
    from ostinato.ops.triton_support import PDL_MAX_ROWS, pdl_options

    if pdl_options(torch.device("cuda"), 1).get("PDL"):
        lines.append(f"PDL on for launches of up to {PDL_MAX_ROWS} rows: such a kernel's time includes its wait "
                     "for the one before, so the times overlap; OSTINATO_NO_PDL=1 gives times that add up")
    return "\n".join(lines)


def kernel_table(fn, per: int, top: int, title: str, on: str = "cuda") -> str:
    """Run ``fn`` under the profiler; kernels (ops, ``on="cpu"``) and their time divided by ``per``,
    the top ones listed."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = on == "cuda"
    with torch_profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wanted = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = collections.Counter()
    kernel_us = collections.Counter()
    for event in prof.events():
        if event.device_type == wanted:
            kernels[event.name] += 1
            if not cuda:
                kernel_us[event.name] += event.self_cpu_time_total
            else:
                kernel_us[event.name] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    out = [f"{title}: {sum(kernels.values()) / per:.0f} kernels, kernel time {sum(kernel_us.values()) / per / 1e3:.3f} ms"]
    for name, us in kernel_us.most_common(top):
        out.append(f"  {us / per:8.1f} us {kernels[name] / per:6.1f}x  {name[:110]}")
    return "\n".join(out)


@torch.inference_mode()
def profile(size: str, batch: int, steps: int, repeats: int, top: int) -> str:
    device = torch.device("cuda")
    model = random_whisper(size, device, torch.float16)
    tok = whisper_tokenizer(model.dims.n_vocab)
    # The K-step rung: its replays can be timed and profiled a fixed number of steps at a time (the
    # device loop runs the same kernels plus one gate kernel per trip; bench/whisper_gpu.py times both).
    decoder = WindowDecoder(model, tok, device, buckets=(batch,), decode_loop="kstep")
    mel = torch.randn(batch, model.dims.n_mels, 3000, device=device, dtype=torch.float16)
    features = model.encoder(mel)
    requests, suppress = forced_requests(tok, batch, steps)
    decoder.decode(features, requests, suppress, [])  # capture
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = decoder.decode(features, requests, suppress, [])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    assert all(len(r.tokens) == steps for r in result), [len(r.tokens) for r in result]
    call_ms = statistics.median(times) * 1e3
    # Steady state: replays alone, every row active throughout (what the per-step targets measure).
    from ostinato.models.whisper.decoding import SearchOptions

    run = decoder.start(SearchOptions(), suppress, [], batch)
    long_requests, _ = forced_requests(tok, batch, 448 - 8)
    run.admit(window_jobs(features, long_requests))
    replays = max(1, steps // decoder.steps_per_replay)
    per_step = replays * decoder.steps_per_replay
    run.advance()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        run.advance()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1e3 / per_step
    lines = [f"== {size} B={batch}: {step_ms:.3f} ms/step steady (graph replays); one call of {steps} steps "
             f"{call_ms:.2f} ms (median of {repeats}) = {call_ms / steps:.3f} ms/step"]
    lines.append(kernel_table(lambda: [run.advance() for _ in range(replays)], per_step, top, "  per step"))
    lines.append(kernel_table(lambda: decoder.decode(features, requests, suppress, []), 1, top,
                              f"  per call (prefill, cross K/V, {steps} steps, results)"))
    run = decoder = model = None  # released before empty_cache (the lambdas above are done with them)
    torch.cuda.empty_cache()
    return "\n".join(lines)


@torch.inference_mode()
def profile_encoder(size: str, batch: int, repeats: int, top: int, on: str = "cuda") -> str:
    """The encoder over ``batch`` windows: ms (median), share of the measured fp16 matmul rate, and
    where its kernel time goes (GEMMs, attention, norms, GELU, adds)."""
    device = torch.device(on)
    dtype = torch.float16 if on == "cuda" else torch.float32
    model = random_whisper(size, device, dtype)
    mel = torch.randn(batch, model.dims.n_mels, 3000, device=device, dtype=dtype)
    model.encoder(mel)
    times = []
    for _ in range(repeats):
        if on == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.encoder(mel)
        if on == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    rate = whisper_encoder_flops(model.dims, batch) / ms / 1e9
    peak = matmul_tflops(device, dtype)
    lines = [f"== encoder {size} B={batch}: {ms:.1f} ms, {rate:.0f} TFLOP/s = {100 * rate / peak:.0f}% of the "
             f"measured matmul rate ({peak:.0f} TFLOP/s)"]
    lines.append(kernel_table(lambda: model.encoder(mel), 1, top, "  per encoder call", on))
    model = None  # released before empty_cache
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["tiny", "large-v3"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--encoder", nargs="*", default=[], metavar="SIZE",
                        help="also profile these sizes' encoders at batch 16 (e.g. large-v3)")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    print(feature_report(), flush=True)
    for size in args.encoder:
        print(profile_encoder(size, 16, args.repeats, args.top), flush=True)
    for size in args.sizes:
        for batch in args.batches:
            print(profile(size, batch, args.steps, args.repeats, args.top), flush=True)


if __name__ == "__main__":
    main()
