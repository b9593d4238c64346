"""Ray Data with ostinato on GPUs: one and two GPU actors against ``transcribe_batch`` directly.

    PYTHONPATH=src python bench/ray_gpu.py [--size small] [--clips 240] [--gpus 1 2] [--model PATH]
    PYTHONPATH=src python bench/ray_gpu.py --smoke        # a small CPU run of the whole script

The same synthetic clips (seeded noise and tones, 20-60 s each) go through (a) one model calling
``transcribe_batch`` on GPU 0 and (b) ``Dataset.map_batches(Transcriber, num_gpus=1)`` with one and
with two actors. Random weights in the shape of ``--size`` (or a checkpoint, ``--model``), greedy,
at most ``--max-new-tokens`` per window, so every configuration does the same work. For Ray the
table gives the wall time of the whole job (actor start, model load and the warm-up included) and
the steady rate: all the audio over the time from the first actor ready to the last batch done, as
each actor reports; the direct rate excludes its load and warm-up alike. Medians over --repeats.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from ostinato.ray import Transcriber

OPTIONS = dict(beam_size=1, best_of=1, temperature=0.0, language="en", condition_on_previous_text=False)


def synthetic_clips(count: int, low: float, high: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    clips = []
    for _ in range(count):
        n = int(rng.uniform(low, high) * 16000)
        t = np.arange(n) / 16000
        tone = 0.1 * np.sin(2 * np.pi * rng.uniform(120, 300) * t) * (np.sin(2 * np.pi * 0.5 * t) > 0)
        clips.append((tone + 0.02 * rng.standard_normal(n)).astype(np.float32))
    return clips


def random_checkpoint_path(size: str, folder: str) -> str:
    from ostinato.testing.random_models import save_random_whisper_checkpoint

    return save_random_whisper_checkpoint(size, os.path.join(folder, f"{size}-random.pt"))


class TimedTranscriber(Transcriber):
    """A Transcriber that warms up before its first batch and stamps when it was ready and when each
    batch finished (seconds since the epoch: the actors share the driver's clock, one machine)."""

    def __init__(self, warmup_audio, **kwargs):
        super().__init__(**kwargs)
        super().__call__({"audio": np.array([warmup_audio, warmup_audio[: len(warmup_audio) // 2]], dtype=object)})
        self.ready = time.time()

    def __call__(self, batch):
        out = super().__call__(batch)
        n = len(out["text"])
        out["t_ready"] = np.full(n, self.ready)
        out["t_done"] = np.full(n, time.time())
        return out


def direct(path: str, clips, args) -> dict:
    from ostinato import load_model

    model = load_model(path, device=args.device, compute_type=args.dtype)
    model.transcribe_batch(clips[:2], batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, **OPTIONS)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        results = model.transcribe_batch(clips, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                          **OPTIONS)
        times.append(time.perf_counter() - start)
    tokens = sum(len(s.tokens) for segments, _ in results for s in segments)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return dict(steady=statistics.median(times), wall=statistics.median(times), tokens=tokens)


def through_ray(path: str, clips, actors: int, args) -> dict:
    import ray

    walls, steadies, tokens = [], [], 0
    for _ in range(args.repeats):
        ds = ray.data.from_items([{"id": i, "audio": a} for i, a in enumerate(clips)])
        ds = ds.map_batches(
            TimedTranscriber, batch_size=args.rows_per_batch, concurrency=actors,
            num_gpus=args.gpus_per_actor,
            fn_constructor_kwargs=dict(warmup_audio=clips[0], model=path, device=args.device, compute_type=args.dtype,
                                       batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, **OPTIONS),
        )
        start = time.time()
        rows = ds.take_all()
        end = time.time()
        assert len(rows) == len(clips) and not any(r["error"] for r in rows), "every clip, no error"
        walls.append(end - start)
        steadies.append(max(r["t_done"] for r in rows) - min(r["t_ready"] for r in rows))
        tokens = sum(len(s["tokens"]) for r in rows for s in r["segments"])
    return dict(steady=statistics.median(steadies), wall=statistics.median(walls), tokens=tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint (default: random weights of --size)")
    parser.add_argument("--size", default="small")
    parser.add_argument("--clips", type=int, default=240)
    parser.add_argument("--min-seconds", type=float, default=20.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU actors to try")
    parser.add_argument("--batch-size", type=int, default=16, help="windows decoded together per model")
    parser.add_argument("--rows-per-batch", type=int, default=64, help="rows Ray hands an actor at a time")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny random weights, a few short clips")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.clips, args.min_seconds, args.max_seconds = "tiny", 6, 3.0, 8.0
        args.gpus, args.rows_per_batch, args.repeats, args.max_new_tokens = [1, 2], 3, 1, 8
    on_gpu = torch.cuda.is_available() and not args.smoke
    args.device, args.dtype = ("cuda", "float16") if on_gpu else ("cpu", "float32")
    args.gpus_per_actor = 1 if on_gpu else 0

    import ray

    ray.init(include_dashboard=False, log_to_driver=False, **({} if on_gpu else {"num_cpus": 2}))
    name = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    count = torch.cuda.device_count() if on_gpu else 0
    print(f"device: {count} x {name}; torch {torch.__version__}; ray {ray.__version__}")
    clips = synthetic_clips(args.clips, args.min_seconds, args.max_seconds)
    audio = sum(len(c) for c in clips) / 16000
    with tempfile.TemporaryDirectory() as folder:
        path = args.model or random_checkpoint_path(args.size, folder)
        print(f"model: {args.model or f'random {args.size}'}; {len(clips)} clips, {audio:.0f} s of audio; "
              f"greedy, at most {args.max_new_tokens} tokens per window; batch {args.batch_size}")
        rows = [("transcribe_batch, 1 GPU", direct(path, clips, args))]
        for actors in args.gpus:
            if on_gpu and actors > count:
                print(f"(skipped {actors} GPU actors: {count} GPU(s) here)")
                continue
            rows.append((f"Ray Data, {actors} {'GPU' if on_gpu else 'CPU'} actor(s)", through_ray(path, clips, actors, args)))
    base = rows[0][1]["steady"]
    print(f"\n{'configuration':<28}{'wall s':>9}{'steady s':>10}{'audio-s/s':>11}{'vs direct':>11}{'tokens':>9}")
    for label, r in rows:
        print(f"{label:<28}{r['wall']:>9.2f}{r['steady']:>10.2f}{audio / r['steady']:>11.0f}"
              f"{base / r['steady']:>10.2f}x{r['tokens']:>9}")
    print("(steady: from the first actor ready to the last batch done; wall: the whole job, start-up included)")
    ray.shutdown()


if __name__ == "__main__":
    main()
