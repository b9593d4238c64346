"""What a first transcription does that the warm one does not, by host operation (issue 16).

    PYTHONPATH=src:dev python dev/first_call_ops.py [--model PATH | --size tiny] [--clips DIR]
        [--batch 16] [--steps-per-replay K] [--top 30] [--warm-repeats 2]

Loads a checkpoint (random weights of ``--size`` without ``--model``), then runs the same
transcription (greedy; bench/whisper_e2e.py's audio with ``--clips``, else 16 synthetic 15-s clips)
under PyTorch's profiler three times: the first call, then warm calls. Prints each call's wall
time, the capture parts (``first_call_profile.time_phases``, the driver's graph instantiation
included), and the host operations and CUDA runtime/driver calls whose own CPU time the first call
spends beyond the last warm one, largest first: lazy kernel loads show up as slow launches, pinned
allocations as cudaHostAlloc, graph work as cudaGraph*/cuGraph*. The profiler is started once on a
trivial op before, so its own start-up is not counted. Random weights decode garbage of the same
length at every ``--steps-per-replay``, so warm times at different K compare the same work.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def own_cpu_ms(prof) -> dict:
    """name -> (calls, own CPU ms) over every thread the profiler saw."""
    return {e.key: (e.count, e.self_cpu_time_total / 1e3) for e in prof.key_averages()}


def record_pinned(torch) -> list:
    """Bytes of each pinned host block asked for (``Tensor.pin_memory`` and ``uploads.padded_host_batch``),
    appended to the returned list (the caching host allocator serves each power-of-two size class)."""
    from ostinato.runtime import uploads

    sizes = []
    pin = torch.Tensor.pin_memory

    def pin_memory(self, *a, **k):
        sizes.append(self.numel() * self.element_size())
        return pin(self, *a, **k)

    torch.Tensor.pin_memory = pin_memory
    padded = uploads.padded_host_batch

    def padded_host_batch(arrays, pinned):
        out = padded(arrays, pinned)
        if pinned:
            sizes.append(out.numel() * out.element_size())
        return out

    uploads.padded_host_batch = padded_host_batch
    return sizes


def size_classes(sizes) -> str:
    counts = {}
    for n in sizes:
        c = 1 << max(0, (n - 1).bit_length())
        counts[c] = counts.get(c, 0) + 1
    return ", ".join(f"{c // 1024 if c >= 1024 else c}{'K' if c >= 1024 else 'B'} x{k}" for c, k in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--model", default=None)
    parser.add_argument("--clips", default=None)
    parser.add_argument("--long-seconds", type=float, default=377.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps-per-replay", type=int, default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--warm-repeats", type=int, default=2)
    parser.add_argument("--cpu-activity-only", action="store_true", help="profile host operations only (no CUPTI)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (decode_loop='eager')")
    parser.add_argument("--no-first-uses", action="store_true",
                        help="without the model's own first uses on the load's helper (an A/B)")
    args = parser.parse_args()

    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from first_call_profile import time_phases
    from ostinato import WhisperModel
    from ostinato.runtime import graphs

    phases, stop_phases = time_phases(torch, graphs)
    pinned = record_pinned(torch)
    if args.no_first_uses:
        from ostinato.runtime import preparation

        preparation.Helper.also = lambda self, work: None
    path = args.model
    if path is None:
        from ostinato.testing.random_models import save_random_whisper_checkpoint

        path = save_random_whisper_checkpoint(args.size, tempfile.mkdtemp() + f"/{args.size}.pt")
    begin = time.perf_counter()
    model = WhisperModel(path, device="cuda", steps_per_replay=args.steps_per_replay,
                         decode_loop="eager" if args.eager else "auto")
    torch.cuda.synchronize()
    t_load = time.perf_counter() - begin
    if args.clips:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
        from whisper_e2e import audio_set

        audios = audio_set(args.clips, long_seconds=args.long_seconds)
    else:
        t = np.arange(15 * 16000) / 16000.0
        audios = [(0.1 * np.sin(2 * np.pi * (200 + 10 * i) * t)).astype(np.float32) for i in range(16)]
    seconds = sum(len(a) for a in audios) / 16000

    def transcribe():
        if args.batch == 1:
            out = [list(model.transcribe(a, beam_size=1, temperature=0.0)[0]) for a in audios]
        else:
            out = model.transcribe_batch(audios, batch_size=args.batch, beam_size=1, temperature=0.0)
        torch.cuda.synchronize()
        return out

    activities = [ProfilerActivity.CPU] + ([] if args.cpu_activity_only else [ProfilerActivity.CUDA])
    with profile(activities=activities):  # the profiler's own first start
        (torch.ones(4, device="cuda") + 1).sum().item()
    calls, pinned_per_call = [], []
    for i in range(1 + args.warm_repeats):
        pinned.clear()
        with profile(activities=activities) as prof:
            begin = time.perf_counter()
            transcribe()
            wall = time.perf_counter() - begin
        if i == 0:
            stop_phases()
        calls.append((wall, own_cpu_ms(prof)))
        pinned_per_call.append(list(pinned))
    print(f"{torch.cuda.get_device_name()}, model {args.model or 'random ' + args.size}, {len(audios)} audios "
          f"({seconds:.0f} s), batch {args.batch}, {model.steps_per_replay} steps per replay; load {t_load:.2f} s")
    print("calls (under the profiler): " + ", ".join(f"{w:.3f} s" for w, _ in calls))
    print("\ncapture parts in the first call (count, seconds):")
    for name, (count, secs) in phases.items():
        print(f"  {name}: {count}, {secs:.3f}")
    for i, sizes in enumerate(pinned_per_call):
        print(f"pinned blocks asked for in call {i}: {len(sizes)}, {sum(sizes) / 2**20:.1f} MiB: {size_classes(sizes)}")
    first, warm = calls[0][1], calls[-1][1]
    rows = []
    for name, (count, ms) in first.items():
        w_count, w_ms = warm.get(name, (0, 0.0))
        rows.append((ms - w_ms, name, count, ms, w_count, w_ms))
    rows.sort(reverse=True)
    print(f"\nown CPU time, first call beyond the last warm one (top {args.top}):")
    print(f"{'extra ms':>9} {'first n':>8} {'first ms':>9} {'warm n':>7} {'warm ms':>8}  name")
    for extra, name, count, ms, w_count, w_ms in rows[: args.top]:
        print(f"{extra:9.1f} {count:8d} {ms:9.1f} {w_count:7d} {w_ms:8.1f}  {name[:90]}")


if __name__ == "__main__":
    main()
