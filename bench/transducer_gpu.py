"""Parakeet-TDT-0.6B-v2's architecture (random weights) on one GPU: ostinato vs a plain eager loop.

    python bench/transducer_gpu.py [--batches 1 32 128] [--min-seconds 10] [--max-seconds 60]

Architecture: FastConformer encoder, 24 layers, d_model 1024, 8 heads, FF 4096, conv kernel 9,
8x depthwise-striding subsampling (256 channels), 128 mel features; 2-layer LSTM prediction net
(640), joint 640, 1024 SentencePiece labels + blank, TDT durations 0-4. About 600M parameters.

Random weights would emit an arbitrary blank/label pattern, so a forward hook on the encoder
adds a fixed per-frame pattern on a few reserved channels that the joint reads with large weights:
on about 30% of frames a label with a duration of 1-3 frames, elsewhere a blank jumping 1-4 frames.
Which label is emitted still comes from the random weights and the prediction network. Both
decoders see the same encoder output, so their tokens must agree (checked).

Prints, per batch size: decode time (ostinato on its best rung, normally the device loop / on the
K-step rung / eager / a plain eager loop) and
end-to-end audio seconds per second (features + encoder + decode) for both; and the encoder's
FLOP count per audio second against the measured dense matmul rate.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

from ostinato.models.transducer.model import TransducerModel, TransducerNetwork
from ostinato.models.transducer.nemo_checkpoint import TransducerConfig
from ostinato.testing.measure import matmul_tflops
from ostinato.testing.random_models import (
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)

@torch.inference_mode()
def plain_eager_decode(net: TransducerNetwork, cfg: TransducerConfig, enc, lengths, max_symbols: int):
    """The textbook greedy TDT loop, one utterance at a time, a host sync per joint evaluation."""
    blank, n_dur = cfg.blank_id, len(cfg.durations)
    durations = cfg.durations
    out = []
    for b in range(enc.shape[0]):
        n = int(lengths[b])
        f = net.joint.project_encoder(enc[b, :n])
        hidden = cfg.pred_hidden
        h = torch.zeros(cfg.pred_layers, 1, hidden, device=enc.device, dtype=enc.dtype)
        c = torch.zeros_like(h)
        g, h, c = net.prednet.step(torch.tensor([blank], device=enc.device), h, c)
        g = net.joint.project_prediction(g)
        tokens, frames, durs = [], [], []
        t, at_frame = 0, 0
        while t < n:
            logits = net.joint(f[t:t + 1], g)[0]
            label = int(logits[:-n_dur].argmax())
            dur = durations[int(logits[-n_dur:].argmax())]
            if label == blank:
                t += max(dur, 1)
                at_frame = 0
                continue
            tokens.append(label)
            frames.append(t)
            durs.append(dur)
            g, h, c = net.prednet.step(torch.tensor([label], device=enc.device), h, c)
            g = net.joint.project_prediction(g)
            if dur == 0:
                at_frame += 1
                if at_frame >= max_symbols:
                    t += 1
                    at_frame = 0
            else:
                t += dur
                at_frame = 0
        out.append((tokens, frames, durs))
    return out


def encoder_flops_per_second(cfg: TransducerConfig, seconds: float) -> float:
    """Multiply-adds x 2 of the encoder for one utterance of ``seconds``."""
    e = cfg.encoder
    T = int(seconds * 100)
    F, C, d = e.feat_in, e.subsampling_conv_channels, e.d_model
    macs = 0.0
    t, f = T, F
    t, f = math.ceil(t / 2), math.ceil(f / 2)
    macs += C * t * f * 9  # conv0
    for _ in range(int(math.log2(e.subsampling_factor)) - 1):
        t, f = math.ceil(t / 2), math.ceil(f / 2)
        macs += C * t * f * 9 + C * C * t * f  # depthwise + pointwise
    macs += t * C * f * d  # output linear
    per_layer = t * (16 * d * d + 4 * d * d + 3 * d * d + e.conv_kernel_size * d)  # FFs, attn proj, conv
    per_layer += (2 * t - 1) * d * d  # linear_pos
    per_layer += t * t * d + t * (2 * t - 1) * d + t * t * d  # q.k, q.p, attn.v
    macs += e.n_layers * per_layer
    return 2 * macs


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int = 1):
    """Median wall time over ``repeats`` runs (device synchronised around each) and the last result."""
    _sync()
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--min-seconds", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--max-symbols", type=int, default=10)
    ap.add_argument("--steps-per-replay", type=int, default=16)
    ap.add_argument("--plain-limit", type=int, default=32, help="run the plain loop on at most this many utterances "
                    "per batch and scale its time (it is slow); 0 = all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test with --layers)")
    ap.add_argument("--layers", type=int, default=None, help="override the encoder depth (smoke tests)")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg = parakeet_tdt_v2_config()
    if args.layers is not None:
        cfg.encoder.n_layers = args.layers
    net = random_transducer_network(cfg, device, dtype)
    install_pattern(net)
    params = sum(p.numel() for p in net.parameters())
    tok = fake_tokenizer(cfg.vocab_size)
    graph = TransducerModel.from_network(net, cfg, tok, device=args.device, compute_type=args.dtype, use_graphs=True,
                                         steps_per_replay=args.steps_per_replay)
    eager = TransducerModel.from_network(net, cfg, tok, device=args.device, compute_type=args.dtype, use_graphs=False,
                                         steps_per_replay=args.steps_per_replay)
    # the rung below the device loop: graphs of steps_per_replay steps, the host reads the rows' flags per replay
    kstep = TransducerModel.from_network(net, cfg, tok, device=args.device, compute_type=args.dtype,
                                         steps_per_replay=args.steps_per_replay,
                                         decode_loop="kstep" if device.type == "cuda" else "eager")
    print(f"decode loop: {graph.decoder.loop_rung}")
    assert eager.network.encoder.layers[0].ff1.linear1.weight is graph.network.encoder.layers[0].ff1.linear1.weight
    rate = matmul_tflops(device, dtype, n=8192 if device.type == "cuda" else 1024) * 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, {args.dtype}")
    print(f"model: Parakeet-TDT-0.6B-v2 architecture, random weights, {params / 1e6:.0f}M parameters")
    print(f"dense {args.dtype} matmul rate (square GEMM): {rate / 1e12:.2f} TFLOP/s")
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batches:
        seconds = rng.uniform(args.min_seconds, args.max_seconds, batch)
        audios = [(0.1 * rng.standard_normal(int(s * 16000))).astype(np.float32) for s in seconds]
        total_audio = float(seconds.sum())
        # stages, measured separately
        feats, flen = graph.features(audios)
        _sync()
        t_feat, (feats, flen) = timed(lambda: graph.features(audios), args.repeats)
        t_enc, (enc, enc_len) = timed(lambda: graph.encode(feats, flen), args.repeats)
        flops = sum(encoder_flops_per_second(cfg, s) for s in seconds)
        graph.decoder.decode(enc, enc_len, args.max_symbols)  # capture this bucket
        t_graph, hyps = timed(lambda: graph.decoder.decode(enc, enc_len, args.max_symbols), args.repeats)
        t_eager, hyps_eager = timed(lambda: eager.decoder.decode(enc, enc_len, args.max_symbols), 1)
        kstep.decoder.decode(enc, enc_len, args.max_symbols)  # capture this bucket
        t_kstep, hyps_kstep = timed(lambda: kstep.decoder.decode(enc, enc_len, args.max_symbols), args.repeats)
        n_plain = batch if args.plain_limit <= 0 else min(batch, args.plain_limit)
        t_plain, plain = timed(lambda: plain_eager_decode(net, cfg, enc[:n_plain], enc_len[:n_plain], args.max_symbols),
                               args.repeats if n_plain <= 4 else 1)
        t_plain_all = t_plain * batch / n_plain
        # graph and eager ostinato run the same step on the same batch: identical. The plain loop
        # runs one row at a time, so a near-tie among random labels may resolve differently.
        for i in range(batch):
            assert (hyps[i].tokens, hyps[i].frames, hyps[i].durations) == (
                hyps_eager[i].tokens, hyps_eager[i].frames, hyps_eager[i].durations), f"row {i}: graph != eager"
            assert (hyps[i].tokens, hyps[i].frames, hyps[i].durations) == (
                hyps_kstep[i].tokens, hyps_kstep[i].frames, hyps_kstep[i].durations), f"row {i}: graph != K-step"
        same = sum((hyps[i].tokens, hyps[i].frames, hyps[i].durations) == plain[i] for i in range(n_plain))
        print(f"batch {batch}: ostinato == plain loop on {same}/{n_plain} utterances", flush=True)
        t_e2e, _ = timed(lambda: graph.transcribe_batch(audios, batch_size=batch, max_symbols=args.max_symbols),
                         args.repeats)
        tokens = sum(len(h.tokens) for h in hyps)
        rows.append((batch, total_audio, tokens, t_feat, t_enc, flops, t_graph, t_kstep, t_eager, t_plain_all, t_e2e,
                     n_plain < batch))
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print()
    print(f"{'batch':>5} {'audio s':>8} {'tokens':>7} | {'decode: graph':>13} {'K-step':>9} {'eager':>8} {'plain':>9} "
          f"{'speedup':>8} | "
          f"{'e2e audio-s/s: ostinato':>23} {'plain':>8} | {'encoder':>8} {'TFLOP/s':>8} {'of peak':>7}")
    for (batch, audio, tokens, t_feat, t_enc, flops, t_graph, t_kstep, t_eager, t_plain, t_e2e, scaled) in rows:
        plain_e2e = audio / (t_feat + t_enc + t_plain)
        mark = "*" if scaled else " "
        print(f"{batch:>5} {audio:>8.0f} {tokens:>7} | {t_graph * 1e3:>10.1f} ms {t_kstep * 1e3:>6.1f} ms "
              f"{t_eager * 1e3:>5.0f} ms "
              f"{t_plain * 1e3:>6.0f} ms{mark} {t_plain / t_graph:>7.1f}x | {audio / t_e2e:>23.0f} {plain_e2e:>8.0f} | "
              f"{t_enc * 1e3:>5.0f} ms {flops / t_enc / 1e12:>8.1f} {flops / t_enc / rate:>6.0%}")
    print("\n* plain-loop time measured on the first --plain-limit utterances and scaled to the batch")
    print(f"memory: {graph.memory_report()}")


if __name__ == "__main__":
    main()
