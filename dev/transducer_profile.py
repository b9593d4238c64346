"""Device check for the transducer fast paths: accuracy of the float16 encoder against float32, a
per-op profile of the encoder at batch 128, kernels per decode step, and decode time per
steps-per-replay. Writes nothing but stdout.

    PYTHONPATH=src python dev/transducer_profile.py [--skip-profile]
"""
import argparse
import os
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ostinato.testing.random_models import (  # noqa: E402
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)

from ostinato.models.transducer.label_looping import TransducerKey, Utterance  # noqa: E402
from ostinato.models.transducer.model import TransducerModel  # noqa: E402


def sync():
    torch.cuda.synchronize()


def timed(fn, n=3):
    fn()
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def audios_for(n, seed, lo=10.0, hi=60.0):
    rng = np.random.default_rng(seed)
    secs = rng.uniform(lo, hi, n)
    return [(0.1 * rng.standard_normal(int(s * 16000))).astype(np.float32) for s in secs], float(secs.sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-profile", action="store_true")
    args = ap.parse_args()
    cfg = parakeet_tdt_v2_config()
    dev = torch.device("cuda")
    tok = fake_tokenizer(cfg.vocab_size)
    net = random_transducer_network(cfg, dev, torch.float16)
    m16 = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16")

    # -- accuracy: float16 (fused kernels and not) against float32 --------------------------------
    net32 = random_transducer_network(cfg, dev, torch.float32)
    m32 = TransducerModel.from_network(net32, cfg, tok, device="cuda", compute_type="float32")
    auds, _ = audios_for(4, 5)
    feats, fl = m32.features(auds)
    e32, l32 = m32.encode(feats, fl)
    for disabled in (False, True):
        os.environ["OSTINATO_NO_TRITON"] = "1" if disabled else "0"
        e16, l16 = m16.encode(feats, fl)
        assert torch.equal(l16, l32)
        errs = []
        for i in range(len(auds)):
            n = int(l32[i])
            a, b = e16[i, :n].float(), e32[i, :n]
            errs.append(((a - b).norm() / b.norm()).item())
        print(f"encoder fp16 ({'torch' if disabled else 'triton'} conv) vs fp32: rel err per row {['%.2e' % e for e in errs]}")
    os.environ["OSTINATO_NO_TRITON"] = "0"
    del net32, m32, e32
    torch.cuda.empty_cache()

    # -- encoder timing and profile at batch 128 -------------------------------------------------
    auds, secs = audios_for(128, 0)
    feats, fl = m16.features(auds)
    t_feat = timed(lambda: m16.features(auds), 2)
    t_enc = timed(lambda: m16.encode(feats, fl), 2)
    groups = m16._length_groups([int(n) for n in fl.tolist()])
    print(f"batch 128 ({secs:.0f} audio s): features {t_feat * 1e3:.1f} ms, encoder {t_enc * 1e3:.1f} ms, "
          f"groups {[len(g) for g in groups]}")
    os.environ["OSTINATO_NO_TRITON"] = "1"
    print(f"  encoder without triton conv: {timed(lambda: m16.encode(feats, fl), 2) * 1e3:.1f} ms")
    os.environ["OSTINATO_NO_TRITON"] = "0"
    grouped = m16.group_overhead_frames
    m16.group_overhead_frames = 10 ** 12
    print(f"  encoder as one padded batch: {timed(lambda: m16.encode(feats, fl), 2) * 1e3:.1f} ms")
    m16.group_overhead_frames = grouped
    torch.cuda.reset_peak_memory_stats()
    m16.encode(feats, fl)
    print(f"  encoder peak memory {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
    if not args.skip_profile:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            m16.encode(feats, fl)
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))

    # -- decode: kernels per step, time per steps_per_replay ------------------------------------
    install_pattern(net)
    auds1, _ = audios_for(1, 0)
    f1, fl1 = m16.features(auds1)
    enc1, el1 = m16.encode(f1, fl1)
    eager = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16", use_graphs=False,
                                         steps_per_replay=2)
    dec = eager.decoder
    hyps = dec.decode(enc1, el1, 10)
    key = TransducerKey(1)
    with torch.inference_mode():
        dec.open_run(1, enc1.shape[1], 10).admit([Utterance(enc1[0], int(el1[0]))])
        dec._replay_step(key)
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dec._replay_step(key)
            sync()
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"two decode steps (fused={dec.fused}): {len(kern)} kernels: "
          + ", ".join(f"{e.name[:40]} {e.device_time:.1f}us" for e in kern))
    for spr in (8, 16):
        m = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16", steps_per_replay=spr)
        got = m.decoder.decode(enc1, el1, 10)
        assert [(h.tokens, h.frames, h.durations) for h in got] == [(h.tokens, h.frames, h.durations) for h in hyps]
        t = timed(lambda: m.decoder.decode(enc1, el1, 10), 5)
        print(f"batch 1 decode, steps_per_replay {spr}: {t * 1e3:.2f} ms ({len(got[0].tokens)} tokens)")
    unfused = TransducerModel.from_network(net, cfg, tok, device="cuda", compute_type="float16", steps_per_replay=16)
    unfused.decoder.fused = False
    got = unfused.decoder.decode(enc1, el1, 10)
    same = [(h.tokens, h.frames, h.durations) for h in got] == [(h.tokens, h.frames, h.durations) for h in hyps]
    n_steps = 0
    with torch.inference_mode():
        dec.open_run(1, enc1.shape[1], 10).admit([Utterance(enc1[0], int(el1[0]))])
        while bool(dec.state["active"][0]):
            dec._replay_step(key)
            n_steps += 2
    print(f"batch 1: {n_steps} label-looping steps")
    print(f"unfused graph decode: {timed(lambda: unfused.decoder.decode(enc1, el1, 10), 5) * 1e3:.2f} ms; same tokens as fused: {same}")


if __name__ == "__main__":
    main()
