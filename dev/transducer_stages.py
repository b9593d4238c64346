"""Where the end-to-end time of ``transcribe_batch`` goes at one batch (device check, stdout only).

Times each stage alone (median of --repeats, synchronised): the samples' checks, the pinned host fill,
the upload, the preprocessor, the encoder, both pipelined group by group, the decoder alone and through the row scheduler; then
one end-to-end call under the profiler: the GPU's busy time (union of kernel and copy intervals)
against the wall time, the largest idle gaps, and the ops with the most host time.

    PYTHONPATH=src python dev/transducer_stages.py [--batch 128] [--repeats 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ostinato.models.transducer.model import TransducerModel
from ostinato.testing.measure import median_seconds
from ostinato.testing.random_models import (
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)


def busy_intervals(prof) -> list:
    """Merged [start, end) microsecond intervals when a kernel or a copy ran on the GPU."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    merged = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def idle_gaps(busy) -> list:
    """(gap ms, ms after the first GPU work where it starts) for each idle gap between busy intervals, smallest first."""
    return sorted(((busy[i + 1][0] - busy[i][1]) / 1e3, (busy[i][1] - busy[0][0]) / 1e3) for i in range(len(busy) - 1))


def largest_gap_host_ops(prof, busy) -> tuple:
    """What the host was doing during the largest GPU idle gap: (gap ms, [(op, ms of it inside the gap)]),
    the longest first; (0, []) with fewer than two busy intervals."""
    if len(busy) < 2:
        return 0.0, []
    i = max(range(len(busy) - 1), key=lambda k: busy[k + 1][0] - busy[k][1])
    lo, hi = busy[i][1], busy[i + 1][0]
    inside = [(e.name, (min(e.time_range.end, hi) - max(e.time_range.start, lo)) / 1e3) for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CPU and e.time_range.start < hi and e.time_range.end > lo]
    return (hi - lo) / 1e3, sorted(inside, key=lambda op: -op[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-symbols", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = parakeet_tdt_v2_config()
    net = random_transducer_network(cfg, dev, torch.float16)
    install_pattern(net)
    m = TransducerModel.from_network(net, cfg, fake_tokenizer(cfg.vocab_size), device="cuda", compute_type="float16")
    rng = np.random.default_rng(0)  # bench/transducer_gpu.py's audio
    seconds = rng.uniform(10.0, 60.0, args.batch)
    audios = [(0.1 * rng.standard_normal(int(s * 16000))).astype(np.float32) for s in seconds]
    print(f"{torch.cuda.get_device_name(dev)}, batch {args.batch}, {seconds.sum():.0f} audio s, "
          f"{sum(a.nbytes for a in audios) / 1e6:.0f} MB of samples")

    def t(fn):
        return median_seconds(fn, args.repeats, dev)

    stages = {}
    stages["load (checks)"], samples = t(lambda: [m._load(a) for a in audios])
    width = max(a.shape[0] for a in samples)
    host = torch.empty(len(samples), width, pin_memory=True)

    def fill():
        for i, a in enumerate(samples):
            host[i, : a.shape[0]].copy_(torch.from_numpy(a))
            host[i, a.shape[0]:].zero_()
    stages["pinned fill"], _ = t(fill)
    stages["H2D copy"], up = t(lambda: host.to(dev, non_blocking=True))
    stages["upload (fill+H2D)"], up = t(lambda: m._upload(samples))
    sizes = torch.tensor([a.shape[0] for a in samples], device=dev)
    stages["preprocessor"], (feats, flen) = t(lambda: m.preprocessor(up, sizes))
    stages["features()"], (feats, flen) = t(lambda: m.features(samples))
    stages["encode()"], (enc, enc_len) = t(lambda: m.encode(feats, flen))
    m.decoder.decode(enc, enc_len, args.max_symbols)
    stages["decoder.decode"], hyps = t(lambda: m.decoder.decode(enc, enc_len, args.max_symbols))
    stages["features+encode, pipelined"], _ = t(lambda: m._encode_samples(samples))
    m._encode_samples = lambda *_: (enc, enc_len)
    stages["scheduler decode"], _ = t(lambda: m._decode_samples(samples, args.batch, args.max_symbols))
    del m._encode_samples
    stages["results (text)"], _ = t(lambda: [m._result(h, x.shape[0]) for h, x in zip(hyps, samples)])
    stages["transcribe_batch"], _ = t(lambda: m.transcribe_batch(audios, batch_size=args.batch))
    for name, s in stages.items():
        print(f"  {name:<28} {s * 1e3:8.1f} ms")

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as prof:
        t0 = time.perf_counter()
        m.transcribe_batch(audios, batch_size=args.batch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    busy = busy_intervals(prof)
    on = sum(e - s for s, e in busy) / 1e3
    gaps = idle_gaps(busy)
    print(f"profiled transcribe_batch: wall {wall * 1e3:.1f} ms (profiler on), GPU busy {on:.1f} ms, "
          f"first..last GPU work {(busy[-1][1] - busy[0][0]) / 1e3:.1f} ms")
    print("largest GPU idle gaps (ms, at ms after the first GPU work): "
          + ", ".join(f"{g:.1f}@{at:.0f}" for g, at in gaps[::-1][:12]))
    gap, ops = largest_gap_host_ops(prof, busy)
    if ops:
        print(f"host ops during the largest gap ({gap:.1f} ms): " + ", ".join(f"{name} {ms:.1f}" for name, ms in ops[:15]))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
