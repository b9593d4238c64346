"""What a process pays the first time it uses each CUDA library, and what attention costs per new shape.

    PYTHONPATH=src python dev/first_use_costs.py libraries   # run it in a fresh process: first uses count once
    PYTHONPATH=src python dev/first_use_costs.py attention

``libraries``: the first half-precision and float32 products (cuBLAS), convolution (cuDNN), float64 FFT
(cuFFT) and embedding, each timed to completion, then the same at a new shape; ``runtime.preparation``
does these beside a model's load. ``attention``: scaled dot-product attention at five new sequence
lengths, with PyTorch's own backend choice and with cuDNN left out (``ops.attention``), then both
backends' kernel time at fixed model shapes (Whisper's encoder, a FastConformer layer with its float bias).
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F


def timed_ms(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def libraries() -> None:
    dev = "cuda"
    print(f"CUDA context: {timed_ms(lambda: torch.zeros(1, device=dev)):.1f} ms")
    half = torch.zeros(20, 384, device=dev, dtype=torch.float16)
    weight = torch.zeros(1536, 384, device=dev, dtype=torch.float16)
    rows = [
        ("linear float16", lambda: F.linear(half, weight), lambda: F.linear(half[:7], weight)),
        ("matmul float32", lambda: torch.zeros(80, 201, device=dev) @ torch.zeros(201, 1000, device=dev),
         lambda: torch.zeros(80, 201, device=dev) @ torch.zeros(201, 999, device=dev)),
        ("conv1d float16", lambda: F.conv1d(torch.zeros(1, 80, 3000, device=dev, dtype=torch.float16),
                                            torch.zeros(384, 80, 3, device=dev, dtype=torch.float16), padding=1),
         lambda: F.conv1d(torch.zeros(1, 80, 8, device=dev, dtype=torch.float16),
                          torch.zeros(4, 80, 3, device=dev, dtype=torch.float16), padding=1)),
        ("rfft float64", lambda: torch.fft.rfft(torch.zeros(1, 400, device=dev, dtype=torch.float64)),
         lambda: torch.fft.rfft(torch.zeros(237, 400, device=dev, dtype=torch.float64))),
        ("embedding", lambda: F.embedding(torch.zeros(1, 5, dtype=torch.long, device=dev), half),
         lambda: F.embedding(torch.zeros(1, 9, dtype=torch.long, device=dev), half)),
    ]
    for name, first, new_shape in rows:
        print(f"{name:16s} first {timed_ms(first):7.1f} ms, at a new shape {timed_ms(new_shape):6.1f} ms")


def attention() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ostinato.ops.attention import attention as plan_free

    dev, half = "cuda", torch.float16

    def call(queries: int, keys: int, fn, masked: bool) -> float:
        q = torch.randn(1, 6, queries, 64, device=dev, dtype=half)
        k, v = torch.randn(1, 6, keys, 64, device=dev, dtype=half), torch.randn(1, 6, keys, 64, device=dev, dtype=half)
        mask = torch.ones(queries, keys, dtype=torch.bool, device=dev).tril(keys - queries) if masked else None
        return timed_ms(lambda: fn(q, k, v, attn_mask=mask))

    for label, fn in (("PyTorch's choice", F.scaled_dot_product_attention), ("ops.attention", plan_free)):
        for masked, keys in ((True, 448), (False, 1500)):
            times = [call(queries, keys, fn, masked) for queries in (11, 23, 37, 52, 64, 64)]
            print(f"{label:17s} {'masked' if masked else 'cross'} {keys:5d} keys, ms per call at new lengths "
                  f"(the last a repeat): " + " ".join(f"{t:.1f}" for t in times))
    shapes = [("Whisper large-v3 encoder, 16 windows", (16, 20, 1500, 64), False),
              ("Whisper tiny encoder, 1 window", (1, 6, 1500, 64), False),
              ("FastConformer 128 x 188 frames, float bias", (128, 8, 188, 128), True),
              ("FastConformer 32 x 750 frames, float bias", (32, 8, 750, 128), True)]
    backends = {"cuDNN": [SDPBackend.CUDNN_ATTENTION],
                "flash/efficient": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}
    for label, (b, h, t, d), bias in shapes:
        q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=half) for _ in range(3))
        mask = torch.randn(b, h, t, t, device=dev, dtype=half) if bias else None
        for name, chosen in backends.items():
            with sdpa_kernel(chosen):
                for _ in range(3):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(20):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                end.record()
                torch.cuda.synchronize()
            print(f"{label:44s} {name:16s} {begin.elapsed_time(end) / 20:.3f} ms")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    {"libraries": libraries, "attention": attention}[sys.argv[1] if len(sys.argv) > 1 else "libraries"]()
