"""Times launch configurations of the transducer's Triton kernels on the device, checks each against
the current default's output, sets kernels.CONFIG to the fastest, and (with --bench) then runs
bench/transducer_gpu.py in the same process with those settings.

    PYTHONPATH=src python dev/transducer_kernels_bench.py [--bench ARGS...]
"""
import sys

import torch
import triton.testing

from ostinato.models.transducer import kernels
from ostinato.models.transducer.encoder import pack_rows


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # us


def pick(name, variants, run, check, timed_run=None):
    ref = None
    best = None
    for v in variants:
        kernels.CONFIG[name] = v
        try:
            out = run()
            torch.cuda.synchronize()
        except Exception as exc:  # a configuration that does not compile
            print(f"  {name} {v}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        if ref is None:
            ref = out
        err = check(out, ref)
        us = bench(timed_run or run)
        print(f"  {name} {v}: {us:8.1f} us  err vs first {err:.1e}")
        if err < 1e-2 and (best is None or us < best[0]):
            best = (us, v)
    kernels.CONFIG[name] = best[1]
    print(f"{name}: chose {best[1]} ({best[0]:.1f} us)")


def rel(a, b):
    if isinstance(a, tuple):
        return max(rel(x, y) for x, y in zip(a, b))
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@torch.inference_mode()
def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    # relative-position attention: a group of the batch-128 run, packed rows of 600-750 frames
    b, t, h, dk = 39, 750, 8, 128
    d = h * dk
    lengths = torch.randint(600, t + 1, (b,), device=dev)
    lengths[0] = t
    rows = pack_rows(lengths, int(lengths.sum()), t)
    qkv = torch.randn(rows.frames, 3 * d, device=dev, dtype=dt)
    width = -(-(2 * t + 7) // 8) * 8
    pr = torch.nn.functional.pad(torch.randn(2 * t - 1, d, device=dev, dtype=dt), (0, 0, width - (2 * t - 1), 8))
    u = torch.randn(h, dk, device=dev, dtype=dt)
    v = torch.randn(h, dk, device=dev, dtype=dt)
    print(f"position term (one cuBLAS product): {bench(lambda: kernels.position_term(qkv, v, pr, t, 0.0884)):.1f} us")
    pos = kernels.position_term(qkv, v, pr, t, 0.0884)
    pick("relpos", [dict(BM=bm, BN=bn, num_warps=w, num_stages=st) for bm, bn, w, st in
                    ((128, 64, 8, 3), (64, 32, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3))],
         lambda: kernels.relpos_attention(qkv, u, pos, rows.starts, rows.lengths, t, 0.0884), rel)
    # subsampling's first two convolutions, one minute per row
    feats = torch.randn(b, 6000, 128, device=dev, dtype=dt)
    conv0 = torch.nn.Conv2d(1, 256, 3, 2, 1).to(dev, dt)
    dw = torch.nn.Conv2d(256, 256, 3, 2, 1, groups=256).to(dev, dt)
    flen = torch.full((b,), 5900, device=dev, dtype=torch.int64)
    sub = [dict(BP=64, BC=128, num_warps=4), dict(BP=64, BC=64, num_warps=4), dict(BP=128, BC=64, num_warps=4),
           dict(BP=32, BC=128, num_warps=4)]
    pick("subsample_first", sub, lambda: kernels.subsample_first(feats, flen, conv0, dw, dt), rel)
    # conv module middle: the GLU taken in the kernel (glu_dwconv) or before it (dwconv)
    w = torch.randn(1024, 1, 9, device=dev, dtype=dt)
    bias = torch.randn(1024, device=dev, dtype=dt)
    variants = [dict(BT=32, BC=64, num_warps=4), dict(BT=16, BC=128, num_warps=4), dict(BT=64, BC=64, num_warps=4),
                dict(BT=32, BC=128, num_warps=4), dict(BT=8, BC=256, num_warps=4)]
    for name, width_in, glu in (("glu_dwconv", 2048, True), ("dwconv", 1024, False)):
        x = torch.randn(rows.frames, width_in, device=dev, dtype=dt)
        pick(name, variants, lambda: kernels.glu_dwconv_silu(x, w, bias, rows.starts, rows.lengths, t, glu=glu), rel)
    # decode kernels at batch 1 and 128
    H, J, n_out, frames = 640, 640, 1030, 800
    W = torch.randn(4 * H, 2 * H, device=dev, dtype=dt) * 0.03
    bW = torch.randn(4 * H, device=dev, dtype=dt) * 0.1
    table = torch.randn(1025, 4 * H, device=dev, dtype=torch.float32)
    Wo = torch.randn(n_out, J, device=dev, dtype=dt) * 0.04
    bo = torch.randn(n_out, device=dev, dtype=dt)
    for rows in (1, 128):
        label = torch.randint(0, 1024, (rows,), device=dev)
        emit = torch.ones(rows, device=dev, dtype=torch.int32)
        h_in = torch.randn(rows, H, device=dev, dtype=dt)
        xin = torch.randn(rows, H, device=dev, dtype=dt)
        h_out = torch.empty_like(h_in)
        c = torch.randn(rows, H, device=dev, dtype=dt)
        c0 = c.clone()

        def launch_lstm():
            kernels.lstm_layer(xin, None, label, h_in, h_out, c, W, bW, emit)
            kernels.lstm_layer(None, table, label, h_in, h_out, c, W, bW, emit)

        def run_lstm():
            c.copy_(c0)
            launch_lstm()
            return h_out.clone(), c.clone()

        name = "lstm" if rows <= 16 else "lstm_wide"
        print(f"rows {rows} (each timing: two layers, layer 1 then layer 0)")
        pick(name, [dict(BJ=4, num_warps=4, BK=64), dict(BJ=4, num_warps=4, BK=128), dict(BJ=4, num_warps=8, BK=128),
                    dict(BJ=8, num_warps=4, BK=64), dict(BJ=8, num_warps=4, BK=128), dict(BJ=4, num_warps=2, BK=128)],
             run_lstm, rel, launch_lstm)
        enc = torch.randn(rows, frames, J, device=dev, dtype=dt)
        g = torch.randn(rows, J, device=dev, dtype=dt)
        t_ = torch.randint(0, frames, (rows,), device=dev)
        last = torch.full((rows,), frames - 1, device=dev)
        out = torch.empty(rows, n_out, device=dev)

        def run_joint():
            kernels.joint_logits(enc, t_, last, g, Wo, bo, out)
            return out.clone()

        pick("joint" if rows <= 16 else "joint_wide", [dict(BN=16, num_warps=4, BK=64), dict(BN=32, num_warps=4, BK=64), dict(BN=16, num_warps=4, BK=128),
                       dict(BN=32, num_warps=4, BK=128), dict(BN=16, num_warps=8, BK=128)],
             run_joint, rel, lambda: kernels.joint_logits(enc, t_, last, g, Wo, bo, out))
    print("CONFIG =", kernels.CONFIG)
    if "--bench" in sys.argv:
        sys.argv = ["bench/transducer_gpu.py"] + sys.argv[sys.argv.index("--bench") + 1:]
        import runpy

        runpy.run_path("bench/transducer_gpu.py", run_name="__main__")


if __name__ == "__main__":
    main()
