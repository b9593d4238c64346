"""One hour of audio through a Parakeet-TDT-0.6B-v2-sized transducer: time, peak memory, coverage.

    PYTHONPATH=src python bench/transducer_long_audio.py [--minutes 60] [--dtype float16]

Random weights with bench/transducer_gpu.py's forced blank/label pattern (about 30% label frames),
so tokens should appear all along the hour. Inputs longer than the model's full-context limit are
encoded in windows with context on both sides and decoded in one continuous pass: the largest gap
between consecutive token frames shows whether anything went missing at a window boundary.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ostinato.testing.random_models import (
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)

from ostinato.models.transducer.model import TransducerModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    cfg = parakeet_tdt_v2_config()
    net = random_transducer_network(cfg, torch.device(args.device), getattr(torch, args.dtype))
    install_pattern(net)
    model = TransducerModel.from_network(net, cfg, fake_tokenizer(cfg.vocab_size), device=args.device,
                                         compute_type=args.dtype)
    seconds = args.minutes * 60
    audio = (0.1 * np.random.default_rng(0).standard_normal(int(seconds * 16000))).astype(np.float32)
    model.transcribe(audio[: 16000 * 20])  # warm-up: captures, kernel compilation
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = model.transcribe(audio)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    frames = np.array(result.frames)
    total_frames = int(np.ceil(seconds / result.frame_seconds))
    gaps = np.diff(np.concatenate([[0], frames, [total_frames]]))
    name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {args.dtype}")
    print(f"audio: {seconds:.0f} s; wall {elapsed:.2f} s; {seconds / elapsed:.0f}x real time")
    print(f"tokens: {len(result.tokens)}; first frame {frames[0] if len(frames) else None}; "
          f"last frame {frames[-1] if len(frames) else None} of {total_frames}; largest gap {gaps.max()} frames")
    print(f"memory: {model.memory_report()}")


if __name__ == "__main__":
    main()
