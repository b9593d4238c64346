"""One long recording, batched against sequential: faster-whisper's BatchedInferencePipeline in ostinato.

    PYTHONPATH=src python bench/whisper_vad_gpu.py [--minutes 60] [--batch-size 8 16]
        [--model PATH | --tiny] [--repeats 3] [--sequential-repeats 1] [--max-new-tokens 128]

The recording is built from the speech test clips with pauses and noise between them
(``ostinato.testing.recordings``, the VAD tests' two plans played in turn until it lasts
``--minutes``). In the same run, on the same model, it is transcribed:
  * sequentially: ``transcribe(audio)``, the window loop over 30-s windows (no VAD);
  * sequentially on the VAD's speech: ``transcribe(audio, vad_filter=True)`` (``--with-vad-sequential``);
  * batched: ``transcribe(audio, batched=True, batch_size=B)`` for each ``--batch-size``: the Silero VAD
    cuts the audio at silences, chunks of at most 30 s decode B at a time;
and the VAD alone is timed (PyTorch on the GPU, and onnxruntime on the CPU as faster-whisper runs it).
Each line gives the median wall time over the repeats (the generator consumed, the device synchronised),
audio-seconds per second, the speed-up over sequential, segments and tokens.

Models: ``--tiny`` is the embedded tiny.en with faster-whisper's defaults on both paths (sequential:
beam 5 with the temperature fallback; batched: beam 5 at temperature 0, its own defaults). Without
``--tiny`` or ``--model``, random weights in large-v3's shape (float16): a random model's windows
never pass the fallback checks and never end on their own, so both paths then decode at
temperature 0 only, without timestamps and without the previous text as prompt, every window
capped at ``--max-new-tokens`` (the same work per window on both paths).
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ostinato.testing.measure import median_seconds
from ostinato.testing.recordings import PLANS, build

RATE = 16000


def recording(minutes: float, clip_dir=None) -> np.ndarray:
    """``minutes`` of the two plans in turn; ``clip_dir``: where the clips are (FLAC, or the int16
    .npy files of dev/export_device_bundle.py on a machine without an audio decoder)."""
    plan = PLANS["pauses"] + PLANS["lecture"]
    where = {} if clip_dir is None else {"clip_dir": clip_dir}
    one = build(plan, **where)
    repeat = max(1, math.ceil(minutes * 60 * RATE / one.shape[0]))
    return build(plan, repeat=repeat, **where)[: int(minutes * 60 * RATE)]


def profile(fn, top: int = 25) -> None:
    """The kernels of one call by GPU time, against its wall time: what a change should remove."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events) / 1e6
    print(f"\nprofile of one batched run: wall {wall:.2f} s (profiled), kernels {total:.2f} s, "
          f"GPU busy {busy_seconds(prof):.2f} s (the rest waits on the host)")
    for e in events[:top]:
        print(f"  {e.self_device_time_total / 1e6:8.3f} s {e.count:8d} x  {e.key[:110]}")


def busy_seconds(prof) -> float:
    """The union of the kernels' intervals: the time the GPU ran anything (overlaps counted once)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA")
    busy, reach = 0.0, -math.inf
    for start, end in spans:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy / 1e6


def consume(model, audio, **options):
    segments, info = model.transcribe(audio, **options)
    return list(segments), info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--model", default=None, help="a checkpoint (default: random large-v3 weights)")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny.en with faster-whisper's defaults")
    ap.add_argument("--size", default="large-v3", help="the random model's shape (default: large-v3)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--repeats", type=int, default=3, help="batched and VAD runs (median)")
    ap.add_argument("--sequential-repeats", type=int, default=1, help="sequential runs (median)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per window with random weights")
    ap.add_argument("--with-vad-sequential", action="store_true", help="also time transcribe(vad_filter=True)")
    ap.add_argument("--clips", default=None, help="the clips' folder (default: tests/data/clips)")
    ap.add_argument("--no-cpu-vad", action="store_true", help="skip timing onnxruntime's VAD on the CPU")
    ap.add_argument("--profile", action="store_true",
                    help="print the top GPU kernels of one batched run (the largest batch size)")
    args = ap.parse_args()

    from ostinato import load_model
    from ostinato.audio import vad

    device = args.device if (args.device != "cuda" or torch.cuda.is_available()) else "cpu"
    dtype = args.dtype if device != "cpu" else "float32"
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    audio = recording(args.minutes, args.clips)
    seconds = audio.shape[0] / RATE

    with tempfile.TemporaryDirectory() as folder:
        if args.tiny:
            path, label = None, "tiny.en (embedded)"
            options = {}
        elif args.model:
            path, label = args.model, args.model
            options = {}
        else:
            from ostinato.testing.random_models import save_random_whisper_checkpoint

            path = save_random_whisper_checkpoint(args.size, Path(folder) / f"{args.size}-random.pt")
            label = f"random {args.size}"
            options = dict(temperature=0.0, without_timestamps=True, condition_on_previous_text=False,
                           max_new_tokens=args.max_new_tokens)
        model = load_model(path, device=device, compute_type=dtype)

    print(f"device: {name}; torch {torch.__version__}; model: {label} ({dtype}); audio {seconds / 60:.1f} min "
          f"({seconds:.0f} s); options {options or 'defaults'}; medians of {args.repeats} "
          f"(sequential {args.sequential_repeats})", flush=True)

    # Warm-up on two minutes: graph captures, kernel builds, the VAD's first call. Each batch size is
    # warmed again right before its timed runs (on ten minutes: full batches, a short last one), since
    # the model keeps one batch state at a time and a new size rebuilds it and captures its graphs.
    warm = audio[: 120 * RATE]
    consume(model, warm, **options)
    consume(model, warm, batched=True, batch_size=args.batch_size[0], **options)

    rows = []
    vad_device, _ = median_seconds(lambda: model.speech_probabilities(audio), args.repeats, device)
    rows.append((f"VAD alone ({vad.resolve_backend('auto', model.device)} on {model.device})", vad_device, None))
    if not args.no_cpu_vad:
        cpu_vad = vad.load_vad("cpu", "onnx")
        vad_cpu, _ = median_seconds(lambda: vad.speech_probabilities(audio, cpu_vad), 1, "cpu")
        rows.append(("VAD alone (onnxruntime on the CPU, as faster-whisper)", vad_cpu, None))

    sequential, (segs, _) = median_seconds(lambda: consume(model, audio, **options), args.sequential_repeats, device)
    rows.append(("sequential transcribe()", sequential, segs))
    if args.with_vad_sequential:
        t, (segs, _) = median_seconds(lambda: consume(model, audio, vad_filter=True, **options), args.sequential_repeats,
                             device)
        rows.append(("sequential, vad_filter=True", t, segs))
    for b in args.batch_size:
        consume(model, audio[: 600 * RATE], batched=True, batch_size=b, **options)
        t, (segs, _) = median_seconds(lambda: consume(model, audio, batched=True, batch_size=b, **options), args.repeats,
                             device)
        rows.append((f"batched=True, batch_size={b}", t, segs))

    if args.profile and torch.device(device).type == "cuda":
        profile(lambda: consume(model, audio, batched=True, batch_size=max(args.batch_size), **options))

    print(f"\n{'':52} {'wall s':>9} {'audio-s/s':>10} {'vs seq.':>8} {'segments':>9} {'tokens':>8}")
    for label, wall, segs in rows:
        speed = f"{seconds / wall:10.1f}"
        ratio = f"{sequential / wall:7.2f}x" if segs is not None else f"{'':8}"
        counts = (f"{len(segs):9d} {sum(len(s.tokens) for s in segs):8d}" if segs is not None else "")
        print(f"{label:52} {wall:9.2f} {speed} {ratio} {counts}")
    if torch.device(device).type == "cuda":
        print(f"\npeak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
