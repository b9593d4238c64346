"""Hours of audio through a Parakeet-TDT-0.6B-v2-sized transducer: one file, or many files together
against the same files one at a time; time, peak memory, coverage.

    PYTHONPATH=src python bench/transducer_long_audio.py [--minutes 60] [--files 1] [--dtype float16]
                                                       [--chunk-batch 8]

Random weights with bench/transducer_gpu.py's forced blank/label pattern (about 30% label frames),
so tokens should appear all along each file. Inputs longer than the model's full-context limit are
encoded in windows with context on both sides (the windows of all files batched together) and each
file is decoded in one continuous pass (the files side by side, one row each): the largest gap
between consecutive token frames shows whether anything went missing at a window boundary.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ostinato.models.transducer.model import TransducerModel
from ostinato.testing.random_models import (
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)


def timed(model, fn):
    """(seconds, peak bytes, result) of ``fn()``."""
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() if cuda else 0, result


def coverage(result, seconds: float) -> str:
    frames = np.array(result.frames)
    total = int(np.ceil(seconds / result.frame_seconds))
    gaps = np.diff(np.concatenate([[0], frames, [total]]))
    return (f"{len(result.tokens)} tokens, last at frame {frames[-1] if len(frames) else None} of {total}, "
            f"largest gap {gaps.max()} frames")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--files", type=int, default=1, help="files of --minutes each; >1 also runs them one at a time")
    ap.add_argument("--chunk-batch", type=int, default=8, help="encoder windows per batch")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None, help="override the encoder depth (smoke tests)")
    ap.add_argument("--window-seconds", type=float, default=None, help="override the full-context limit and the "
                    "window length (smoke tests on short audio)")
    args = ap.parse_args()
    cfg = parakeet_tdt_v2_config()
    if args.layers is not None:
        cfg.encoder.n_layers = args.layers
    windows = {}
    if args.window_seconds is not None:
        windows = dict(max_full_context_seconds=args.window_seconds, chunk_seconds=args.window_seconds,
                       chunk_context_seconds=args.window_seconds / 6)
    net = random_transducer_network(cfg, torch.device(args.device), getattr(torch, args.dtype))
    install_pattern(net)
    model = TransducerModel.from_network(net, cfg, fake_tokenizer(cfg.vocab_size), device=args.device,
                                         compute_type=args.dtype, chunk_batch=args.chunk_batch, **windows)
    seconds = args.minutes * 60
    rng = np.random.default_rng(0)
    audios = [(0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32) for _ in range(args.files)]
    model.transcribe_batch([a[: 16000 * 20] for a in audios], batch_size=args.files)  # captures, compilation
    name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {args.dtype}; encoder windows of "
          f"{model.chunk_frames / 100:g} s with {model.chunk_context_frames / 100:g} s context each side, "
          f"{model.chunk_batch} per batch")
    audio_total = seconds * args.files
    if args.files == 1:
        elapsed, peak, result = timed(model, lambda: model.transcribe(audios[0]))
        print(f"audio: {seconds:.0f} s; wall {elapsed:.2f} s; {seconds / elapsed:.0f}x real time; "
              f"peak {peak / 2**30:.2f} GiB")
        print(f"  {coverage(result, seconds)}")
    else:
        t_one, peak_one, alone = timed(model, lambda: [model.transcribe(a) for a in audios])
        t_all, peak_all, together = timed(model, lambda: model.transcribe_batch(audios, batch_size=args.files))
        same = sum((a.tokens, a.frames, a.durations) == (b.tokens, b.frames, b.durations)
                   for a, b in zip(alone, together))
        print(f"audio: {args.files} files of {seconds:.0f} s ({audio_total / 3600:.1f} h)")
        print(f"{'':<22} {'wall':>8} {'x real time':>12} {'peak GiB':>9}")
        print(f"{'one file at a time':<22} {t_one:>7.2f}s {audio_total / t_one:>12.0f} {peak_one / 2**30:>9.2f}")
        print(f"{'all files together':<22} {t_all:>7.2f}s {audio_total / t_all:>12.0f} {peak_all / 2**30:>9.2f}")
        print(f"speed-up {t_one / t_all:.2f}x; identical results on {same}/{args.files} files")
        for i, r in enumerate(together):
            print(f"  file {i}: {coverage(r, seconds)}")
    print(f"memory: {model.memory_report()}")


if __name__ == "__main__":
    main()
