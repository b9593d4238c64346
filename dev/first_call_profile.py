"""Where a fresh process's first transcription spends its time (issue 16: first run vs warm).

    PYTHONPATH=src python dev/first_call_profile.py [--size tiny|large-v3] [--model PATH] [--batch 1]
        [--seconds 15] [--top 40] [--steps-per-replay K] [--clips DIR [--long-seconds 377]] [--defaults | --config NAME]

Loads a checkpoint (``--model``, else random weights of ``--size``), then transcribes ``--batch``
copies of a synthetic clip twice: the first call under cProfile, the second timed warm. Prints each
CUDA graph capture (graph name, bucket key, seconds: warm-ups included), each Triton compile or
cache load, and the profile's heaviest functions by cumulative and own time. Run it twice with
the same ``TRITON_CACHE_DIR`` to see the cache-warm case. ``--clips``: instead of the synthetic clip,
bench/whisper_e2e.py's audio (the clips and a long recording made of them); ``--defaults``: the
default options (beam 5, temperature fallback) instead of greedy; ``--config``: the options and batch
size of one of bench/whisper_e2e.py's configurations (chunked-b16: VAD chunks side by side). Also
prints where the captures' time went (warm-ups, capture begin/end, the device loop's assembly,
synchronizations, cache emptying, garbage collection), each timed on the wall clock outside
cProfile's accounting;
``--torch-capture`` captures inside ``torch.cuda.graph`` instead of ``runtime.graphs.capturing``
(what it synchronizes and empties before each capture, for an A/B in two processes);
``--warm-profile`` profiles a third (warm) call too: the host work of the thread that runs the model.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def time_phases(torch, graphs):
    """Wrap the calls a capture spends its time in with wall-clock totals: (totals, stop), where
    ``stop()`` ends the counting (``main`` calls it when the first call ends)."""
    import gc

    from ostinato.runtime import device_loop

    totals = {}
    counting = [True]  # emptied by stop()
    targets = [(graphs.StepGraph, "_warm_up"), (device_loop.DeviceLoop, "assemble"),
               (torch.cuda.CUDAGraph, "capture_begin"), (torch.cuda.CUDAGraph, "capture_end"),
               (torch.cuda, "synchronize"), (torch.cuda, "empty_cache"), (gc, "collect")]
    try:  # the driver's instantiation of a device loop (inside assemble)
        from cuda.bindings import driver

        targets.append((driver, "cuGraphInstantiate"))
    except ImportError:
        pass
    for owner, name in targets:
        original = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        totals[label] = [0, 0.0]

        def timed(*a, _original=original, _label=label, **k):
            begin = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                if counting:
                    totals[_label][0] += 1
                    totals[_label][1] += time.perf_counter() - begin

        setattr(owner, name, timed)
    return totals, counting.clear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--steps-per-replay", type=int, default=None)
    parser.add_argument("--clips", default=None, help="bench/whisper_e2e.py's audio from these clips")
    parser.add_argument("--long-seconds", type=float, default=377.0)
    parser.add_argument("--defaults", action="store_true", help="beam 5 with the fallback, not greedy")
    parser.add_argument("--config", default=None, help="options and batch of a bench/whisper_e2e.py configuration")
    parser.add_argument("--torch-capture", action="store_true", help="capture inside torch.cuda.graph")
    parser.add_argument("--warm-profile", action="store_true",
                        help="also profile the warm call (after an untimed second call): the engine thread's host work")
    args = parser.parse_args()

    start = time.perf_counter()
    import numpy as np
    import torch

    t_torch = time.perf_counter() - start
    from ostinato import WhisperModel
    from ostinato.runtime import graphs

    t_import = time.perf_counter() - start - t_torch
    captures = []
    original_capture = graphs.StepGraph.capture

    def timed_capture(self, key, **inputs):
        begin = time.perf_counter()
        original_capture(self, key, **inputs)
        captures.append((self.name, repr(key), time.perf_counter() - begin))

    graphs.StepGraph.capture = timed_capture
    phases, stop_timing_phases = time_phases(torch, graphs)
    if args.torch_capture:
        import contextlib

        @contextlib.contextmanager
        def torch_capturing(graph, pool, device):
            with torch.cuda.graph(graph, pool=pool):
                yield

        graphs.capturing = torch_capturing

    compiles = []
    try:
        import triton.compiler.compiler as triton_compiler

        original_compile = triton_compiler.compile

        def timed_compile(src, *a, **k):
            begin = time.perf_counter()
            out = original_compile(src, *a, **k)
            compiles.append((getattr(getattr(src, "fn", None), "__name__", str(src)[:40]), time.perf_counter() - begin))
            return out

        import triton.compiler

        # JITFunction binds triton.compiler.compile when it first launches (Triton 3.x).
        triton_compiler.compile = triton.compiler.compile = timed_compile
    except ImportError:
        pass

    path = args.model
    if path is None:
        from ostinato.testing.random_models import save_random_whisper_checkpoint

        path = save_random_whisper_checkpoint(args.size, tempfile.mkdtemp() + f"/{args.size}.pt")
    begin = time.perf_counter()
    model = WhisperModel(path, device="cuda" if torch.cuda.is_available() else "cpu",
                         steps_per_replay=args.steps_per_replay)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t_load = time.perf_counter() - begin
    at_load = compiles[:]  # the kernel manifest's preload (ops.kernel_manifest)
    del compiles[:]
    options = {} if args.defaults else dict(beam_size=1, temperature=0.0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # whisper_e2e's configurations, audio
    if args.config:
        from whisper_e2e import CONFIGS

        options, args.batch = CONFIGS[args.config]["options"], CONFIGS[args.config]["batch"]
    if args.clips:
        from whisper_e2e import audio_set

        audios = audio_set(args.clips, long_seconds=args.long_seconds)
        what = f"{len(audios) - 1} clips + a {args.long_seconds:.0f}-s recording"
    else:
        rng = np.random.default_rng(0)
        t = np.arange(int(args.seconds * 16000)) / 16000.0
        clip = (0.1 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) +
                0.01 * rng.standard_normal(t.shape)).astype(np.float32)
        audios = [clip] * args.batch
        what = f"{args.batch} x a {args.seconds:.0f} s clip"

    def transcribe():
        if args.batch == 1:
            out = [list(model.transcribe(audio, **options)[0]) for audio in audios]
        else:
            out = model.transcribe_batch(audios, batch_size=args.batch, **options)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    def profiled():
        """(profile, seconds) of one call under cProfile (Python 3.12's sees every thread)."""
        profile = cProfile.Profile()
        begin = time.perf_counter()
        profile.enable()
        transcribe()
        profile.disable()
        return profile, time.perf_counter() - begin

    profiler, t_first = profiled()
    stop_timing_phases()
    first_captures, first_compiles = len(captures), len(compiles)
    begin = time.perf_counter()
    transcribe()
    t_warm = time.perf_counter() - begin
    warm_profiler = None
    if args.warm_profile:  # a third call: captures met in the second (a bucket's second need) are done
        warm_profiler, t_warm_profiled = profiled()
    print(f"model {args.model or 'random ' + args.size}, batch {args.batch}, {what}, "
          f"{args.config or ('defaults' if args.defaults else 'greedy')}, "
          f"{model.steps_per_replay} steps per replay, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
    print(f"import torch {t_torch:.2f} s, import ostinato {t_import:.2f} s, load {t_load:.2f} s, "
          f"first transcribe {t_first:.2f} s (under cProfile), warm {t_warm:.3f} s")
    per_graph = defaultdict(lambda: [0, 0.0])
    for name, key, seconds in captures[:first_captures]:
        per_graph[name][0] += 1
        per_graph[name][1] += seconds
    print(f"\n{first_captures} captures in the first call, {sum(c[2] for c in captures[:first_captures]):.2f} s;"
          f" {len(captures) - first_captures} in the warm call")
    for name, (count, seconds) in sorted(per_graph.items(), key=lambda x: -x[1][1]):
        print(f"  {name}: {count} captures, {seconds:.3f} s")
    for name, key, seconds in captures[:first_captures][:30]:
        print(f"    {seconds * 1e3:7.1f} ms  {name} {key}")
    print("\nwall time inside these calls, first call (count, seconds):")
    for name, (count, seconds) in phases.items():
        print(f"  {name}: {count}, {seconds:.3f}")
    print(f"\n{len(at_load)} Triton compiles/cache loads during the load (earlier processes' kernels), "
          f"{sum(c[1] for c in at_load):.2f} s")
    print(f"{first_compiles} Triton compiles/cache loads in the first call, "
          f"{sum(c[1] for c in compiles[:first_compiles]):.2f} s")
    for name, seconds in compiles[:30]:
        print(f"    {seconds * 1e3:7.1f} ms  {name}")
    profiles = [("first call", profiler)]
    if warm_profiler is not None:
        profiles.append((f"warm call ({t_warm_profiled:.3f} s under cProfile)", warm_profiler))
    for label, profile in profiles:
        for order in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(args.top)
            print(f"\n== {label}, by {order} ==")
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-12000:])


if __name__ == "__main__":
    main()
