"""ostinato.ops.skinny vs plain PyTorch at Whisper large-v3's decode sizes, on one GPU.

    PYTHONPATH=src python bench/skinny_ops.py [--dtype float16|bfloat16] [--rows 1 16]

linear: the fused kernel(s) vs F.linear followed by the separate GELU / residual add that the
unfused decoder launches, per layer shape; add_layer_norm: the fused kernel vs x + u then F.layer_norm.
Two timings each, in microseconds:
  eager  triton.testing.do_bench median (L2 flushed before each call; includes host launch overhead,
         which dominates these small kernels when launched one by one from Python);
  graph  the call captured in a CUDA graph over enough weight copies (>= 256 MB) that every call reads
         its weight from memory, as in a 32-layer decode step: GPU time only, what the decoder's
         graphs pay. GB/s = weight bytes / graph time (the floor: every weight is read once).
layers: 32 decoder layers' LayerNorms and linears (no attention) in one graph, per step. One shape
after another, as the decoder runs them: a kernel's cost can depend on its neighbours (PDL's early
launch made one-wave kernels at 80 rows slower in sequence although each was faster alone), so this
is the number that predicts a decode step; the per-shape table does not.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

from ostinato.ops import skinny
from ostinato.testing.measure import replay_median_us

D = 1280
# (name, N, K, bias, gelu, residual)
SHAPES = [("qkv", 3 * D, D, True, False, False), ("attn out", D, D, True, False, True),
          ("fc1+gelu", 4 * D, D, True, True, False), ("fc2+res", D, 4 * D, True, False, True),
          ("vocab", 51866, D, False, False, False)]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3  # microseconds


def graph_time(fn, weights: list[torch.Tensor], reps: int = 10) -> float:
    """Median microseconds per fn(weight) call, captured in one graph that cycles through the
    weight copies (so none is still in L2 when read again)."""
    copies = max(1, min(256, -(-(256 << 20) // (weights[0].numel() * weights[0].element_size()))))
    sets = [[w.clone() for w in weights] for _ in range(copies)]
    calls = max(copies, 64)

    def body():
        for i in range(calls):
            fn(*sets[i % copies])

    return replay_median_us(lambda: fn(*sets[0]), body, reps) / calls


def layers_time(m: int, dtype: torch.dtype, fused: bool, layers: int = 32, reps: int = 15) -> float:
    """Median microseconds of one step of ``layers`` decoder layers' LayerNorms and linears at ``m``
    rows (attention left out: the out projection reads the first third of the qkv output)."""
    def weight(n, k):
        return torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5

    def vec(n):
        return torch.randn(n, device="cuda", dtype=dtype) * 0.1

    params = [dict(qkv=(weight(3 * D, D), vec(3 * D)), out=(weight(D, D), vec(D)), cross_q=(weight(D, D), vec(D)),
                   cross_out=(weight(D, D), vec(D)), fc1=(weight(4 * D, D), vec(4 * D)), fc2=(weight(D, 4 * D), vec(D)),
                   ln=(1 + vec(D), vec(D))) for _ in range(layers)]

    def linear(x, wb, residual=None, gelu=False):
        if fused:
            return skinny.linear(x, *wb, residual=residual, gelu=gelu)
        y = F.linear(x, *wb)
        y = F.gelu(y) if gelu else y
        return y if residual is None else y + residual

    def norm(x, wb):
        return skinny.add_layer_norm(x, None, *wb)[1] if fused else F.layer_norm(x, (D,), *wb)

    def step(x):
        for p in params:
            qkv = linear(norm(x, p["ln"]), p["qkv"])
            x = linear(qkv[:, :D], p["out"], residual=x)
            x = linear(linear(norm(x, p["ln"]), p["cross_q"]), p["cross_out"], residual=x)
            x = linear(linear(norm(x, p["ln"]), p["fc1"], gelu=True), p["fc2"], residual=x)
        return x

    x = torch.randn(m, D, device="cuda", dtype=dtype)
    return replay_median_us(lambda: step(x), lambda: step(x), reps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 80])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()} ({skinny._sm_count(dev)} SMs), {args.dtype}")
    print(f"{'':10s} {'':3s} {'':6s} {'':5s} {'':16s} | {'eager us':^15s} | {'graph us':^15s} | {'graph GB/s':^13s}")
    print(f"{'linear':10s} {'M':>3s} {'N':>6s} {'K':>5s} {'blocks x splits':>16s} | {'torch':>7s} {'skinny':>7s} | "
          f"{'torch':>7s} {'skinny':>7s} | {'torch':>6s} {'skinny':>6s}")
    for m in args.rows:
        for name, n, k, bias, gelu, res in SHAPES:
            x = torch.randn(m, 1, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
            b = torch.randn(n, device=dev, dtype=dtype) if bias else None
            r = torch.randn(m, 1, n, device=dev, dtype=dtype) if res else None

            def plain(w):
                y = F.linear(x, w, b)
                if gelu:
                    y = F.gelu(y)
                return y + r if r is not None else y

            def fused(w):
                return skinny.linear(x, w, b, residual=r, gelu=gelu)

            e_torch, e_skinny = bench(lambda: plain(w)), bench(lambda: fused(w))
            g_torch, g_skinny = graph_time(plain, [w]), graph_time(fused, [w])
            mb = w.numel() * w.element_size() / 1e3  # bytes per microsecond / 1e3 = GB/s
            p = skinny.linear_plan(m, n, k, skinny._sm_count(dev), w.element_size())
            plan = f"{p['n_blocks'] * p['m_blocks']}x{p['programs_k']} BM{p['block_m']}"
            print(f"{name:10s} {m:3d} {n:6d} {k:5d} {plan:>16s} | {e_torch:7.1f} {e_skinny:7.1f} | "
                  f"{g_torch:7.1f} {g_skinny:7.1f} | {mb / g_torch:6.0f} {mb / g_skinny:6.0f}")
    print(f"{'add+LN':10s} {'M':>3s} {'N':>6s} | {'eager torch':>11s} {'skinny':>7s} | "
          f"{'graph torch':>11s} {'skinny':>7s}")
    for m in args.rows + [64]:
        x = torch.randn(m, 1, D, device=dev, dtype=dtype)
        u = torch.randn(m, 1, D, device=dev, dtype=dtype)
        lw = torch.ones(D, device=dev, dtype=dtype)
        lb = torch.zeros(D, device=dev, dtype=dtype)

        def plain_ln(lw):
            y = x + u
            return y, F.layer_norm(y, (D,), lw, lb)

        def fused_ln(lw):
            return skinny.add_layer_norm(x, u, lw, lb)

        e_torch, e_skinny = bench(lambda: plain_ln(lw)), bench(lambda: fused_ln(lw))
        g_torch, g_skinny = graph_time(plain_ln, [lw]), graph_time(fused_ln, [lw])
        print(f"{'add+LN':10s} {m:3d} {D:6d} | {e_torch:11.1f} {e_skinny:7.1f} | {g_torch:11.1f} {g_skinny:7.1f}")
    print(f"{'layers':10s} {'M':>3s} | 32 layers' LayerNorms + linears, us per step: {'torch':>7s} {'skinny':>7s}")
    for m in args.rows:
        print(f"{'layers':10s} {m:3d} | {'':46s} {layers_time(m, dtype, False):7.0f} "
              f"{layers_time(m, dtype, True):7.0f}")


if __name__ == "__main__":
    main()
