"""decode_attention (flash-decoding, Triton) vs torch SDPA for one decode step, on a GPU.

    python bench/decode_attention.py [--dtype float16] [--programs-per-sm 2 4]

Each side runs in a CUDA graph, as decoding does, over enough copies of the inputs (one call each)
that together they overflow the L2: K/V come from memory, as in a real step over many layers, and
launch gaps stay out. Times are medians of triton.testing.do_bench over graph replays, divided by
the number of calls. GB/s counts the K/V bytes a step needs: each row's valid keys only. SDPA gets
the lengths as a boolean mask [B, 1, 1, S] (and so reads all S keys).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

from ostinato.ops import decode_attention as da

CASES = [  # B, H, S, typical valid length (None: all keys, as in cross-attention)
    (1, 6, 448, None),
    (1, 20, 1500, None),
    (16, 20, 1500, None),
    (16, 20, 448, 100),
]
DIM = 64
SPAN_BYTES = 256 << 20  # inputs spread over this much memory, several times any L2


def make_sets(b, h, seq, typical, dtype, dev):
    one = b * h * seq * DIM * 2 * torch.finfo(dtype).bits // 8
    sets = []
    for _ in range(max(1, min(512, SPAN_BYTES // one))):
        q = torch.randn(b, h, DIM, device=dev, dtype=dtype)
        k = torch.randn(b, h, seq, DIM, device=dev, dtype=dtype)
        v = torch.randn_like(k)
        lengths = None if typical is None else torch.randint(typical - 20, typical + 21, (b,), device=dev)
        sets.append((q, k, v, lengths))
    return sets


def ours(q, k, v, lengths):
    return da.decode_attention(q, k, v, lengths)


def sdpa(q, k, v, lengths):
    mask = None
    if lengths is not None:
        mask = (torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


def time_per_call_us(fn, sets) -> float:
    for s in sets:  # compile / pick kernels outside the capture
        fn(*s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in sets:
            fn(*s)
    return triton.testing.do_bench(graph.replay, return_mode="median") * 1e3 / len(sets)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--programs-per-sm", type=int, nargs="*", default=[da.PROGRAMS_PER_SM])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    n_sm = da._sm_count(dev)
    print(f"{torch.cuda.get_device_name()} ({n_sm} SMs), {args.dtype}, D={DIM}, one call in a CUDA graph, cold L2")
    print(f"{'B':>3} {'H':>3} {'S':>5} {'len':>5} {'pps':>3} {'splits':>6} | {'ours us':>8} {'GB/s':>6} | "
          f"{'sdpa us':>8} {'GB/s':>6} | speedup")
    for b, h, seq, typical in CASES:
        torch.manual_seed(0)
        sets = make_sets(b, h, seq, typical, dtype, dev)
        keys = b * seq if typical is None else sum(int(s[3].sum()) for s in sets) / len(sets)
        gbytes = keys * h * DIM * 2 * torch.finfo(dtype).bits / 8 / 1e9
        sdpa_us = time_per_call_us(sdpa, sets)
        for pps in args.programs_per_sm:
            da.PROGRAMS_PER_SM = pps
            assert (ours(*sets[0]).float() - sdpa(*sets[0]).float()).abs().max().item() < 2e-2
            us = time_per_call_us(ours, sets)
            splits, _ = da.split_plan(seq, b * h, n_sm)
            print(f"{b:3d} {h:3d} {seq:5d} {typical or seq:5d} {pps:3d} {splits:6d} | {us:8.1f} {gbytes / us * 1e6:6.0f} | "
                  f"{sdpa_us:8.1f} {gbytes / sdpa_us * 1e6:6.0f} | {sdpa_us / us:5.2f}x")


if __name__ == "__main__":
    main()
