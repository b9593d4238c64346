"""Decode-step time of one Whisper window: ostinato's replayed graph vs the same step run eagerly.

    PYTHONPATH=src python bench/whisper_decode_step.py [--model PATH] [--dtype float16] [--steps 200]

A 30-s window of noise is encoded once; the decoder then runs a forced number of steps (end-of-text
is suppressed) so both paths do the same work. Prints a table with medians over repeats and the
device it ran on. The eager path is plain PyTorch on the same weights: it is the peer every
framework-style decoder loop pays for. The full comparison against HF transformers and
openai-whisper belongs in bench/whisper_gpu.py.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ostinato import WhisperModel
from ostinato.audio import whisper_input_features
from ostinato.models.whisper.decoding import WindowRequest

ROOT = Path(__file__).resolve().parents[1]


def time_decode(model: WhisperModel, features: torch.Tensor, steps: int, repeats: int) -> tuple[float, int]:
    tok = model.tokenizer
    request = WindowRequest(prompt=tok.sot_sequence("en", "transcribe"), timestamps=False,
                            max_initial_timestamp_index=50, max_new_tokens=steps)
    suppress = list(tok.suppressed_tokens([-1])) + [tok.eot]
    audio_features = model.encode(features[None])
    model.decode(audio_features, [request], suppress, [])  # capture / warm up
    times = []
    for _ in range(repeats):
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = model.decode(audio_features, [request], suppress, [])[0]
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(result.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "tests/data/checkpoints/huggingface"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    audio = (0.1 * np.random.default_rng(0).standard_normal(30 * 16000)).astype(np.float32)
    rows = []
    for label, use_graphs in (("ostinato graph", True), ("eager PyTorch (same step)", False)):
        model = WhisperModel(args.model, device=args.device, compute_type=args.dtype, use_graphs=use_graphs)
        features = whisper_input_features(audio, model.dims.n_mels, device=model.device)[:, :3000]
        if model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds, n = time_decode(model, features, args.steps, args.repeats)
        report = model.memory_report()
        rows.append((label, seconds * 1e3 / n, n, report))
        device_name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "CPU"
        del model
    print(f"device: {device_name}; torch {torch.__version__}; model {args.model}; dtype {args.dtype}")
    print(f"{'path':<28}{'ms/step (median)':>18}{'steps':>8}   memory")
    for label, ms, n, report in rows:
        print(f"{label:<28}{ms:>18.3f}{n:>8}   {report}")
    print(f"speed-up of the graph path: {rows[1][1] / rows[0][1]:.1f}x")


if __name__ == "__main__":
    main()
