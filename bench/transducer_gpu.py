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

import numpy as np
import torch

from ostinato.models.transducer.model import TransducerModel
from ostinato.models.transducer.nemo_checkpoint import TransducerConfig
from ostinato.testing.measure import matmul_tflops, median_seconds
from ostinato.testing.random_models import (
    fake_tokenizer, install_pattern, parakeet_tdt_v2_config, random_transducer_network,
)
from ostinato.testing.transducer_oracle import (
    check_ties, compare_with_plain, plain_greedy_decode, record_decisions,
)

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


def explain_differences(stepper, net, cfg, enc, enc_len, max_symbols, hyps, plain_logs) -> None:
    """Where an utterance parts from the plain loop: both choices measured in float64 (see
    ``ostinato.testing.transducer_oracle``); also checks every decision of ostinato the same way."""
    log = record_decisions(stepper, enc, enc_len.tolist(), max_symbols)
    for i, hyp in enumerate(hyps):  # the step-by-step log is the graphs' arithmetic
        emitted = [(lab, t) for lab, t, a in zip(log.label[:, i], log.t[:, i], log.active[:, i])
                   if a and lab != cfg.blank_id]
        assert emitted == list(zip(hyp.tokens, hyp.frames)), f"row {i}: step-by-step != graph"
    same, divergences, replay = compare_with_plain(net, cfg, enc, enc_len.tolist(), log, plain_logs)
    tol = replay.tolerance()
    margins = np.fmax(replay.label_margin, replay.duration_margin)
    decided = np.isfinite(margins)
    print(f"  float64 replay of ostinato's {int(decided.sum())} decisions: largest rounding error of a chosen logit "
          f"{replay.largest_rounding_error:.2f} ulp (tie tolerance {tol:.2f} ulp); {int((margins[decided] > 0).sum())} "
          f"decisions are not the exact best, the worst by {replay.worst_margin():.2f} ulp")
    for d in divergences:
        print("  " + d.describe(tol))
    problem = check_ties(divergences, replay)
    print("  every difference is a tie within rounding" if problem is None else f"  PROBLEM: {problem}", flush=True)


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
    ap.add_argument("--explain", action="store_true", help="replay ostinato's decisions in float64 even when "
                    "every utterance matches the plain loop")
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
    # the same kernels one step at a time, to say where a row parts from the plain loop
    stepper = TransducerModel.from_network(net, cfg, tok, device=args.device, compute_type=args.dtype,
                                           use_graphs=False, steps_per_replay=1).decoder
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
        t_feat, (feats, flen) = median_seconds(lambda: graph.features(audios), args.repeats, device)
        t_enc, (enc, enc_len) = median_seconds(lambda: graph.encode(feats, flen), args.repeats, device)
        flops = sum(encoder_flops_per_second(cfg, s) for s in seconds)
        graph.decoder.decode(enc, enc_len, args.max_symbols)  # capture this bucket
        t_graph, hyps = median_seconds(lambda: graph.decoder.decode(enc, enc_len, args.max_symbols), args.repeats, device)
        t_eager, hyps_eager = median_seconds(lambda: eager.decoder.decode(enc, enc_len, args.max_symbols), 1, device)
        kstep.decoder.decode(enc, enc_len, args.max_symbols)  # capture this bucket
        t_kstep, hyps_kstep = median_seconds(lambda: kstep.decoder.decode(enc, enc_len, args.max_symbols), args.repeats, device)
        n_plain = batch if args.plain_limit <= 0 else min(batch, args.plain_limit)
        t_plain, (plain, plain_logs) = median_seconds(
            lambda: plain_greedy_decode(net, cfg, enc[:n_plain], enc_len[:n_plain], args.max_symbols),
            args.repeats if n_plain <= 4 else 1, device)
        t_plain_all = t_plain * batch / n_plain
        # graph and eager ostinato run the same step on the same batch: identical. The plain loop
        # runs one row at a time, so a near-tie among random labels may resolve differently:
        # explain_differences measures every difference in float64
        for i in range(batch):
            assert (hyps[i].tokens, hyps[i].frames, hyps[i].durations) == (
                hyps_eager[i].tokens, hyps_eager[i].frames, hyps_eager[i].durations), f"row {i}: graph != eager"
            assert (hyps[i].tokens, hyps[i].frames, hyps[i].durations) == (
                hyps_kstep[i].tokens, hyps_kstep[i].frames, hyps_kstep[i].durations), f"row {i}: graph != K-step"
        same = sum((hyps[i].tokens, hyps[i].frames, hyps[i].durations) == plain[i] for i in range(n_plain))
        print(f"batch {batch}: ostinato == plain loop on {same}/{n_plain} utterances", flush=True)
        if same < n_plain or args.explain:
            explain_differences(stepper, net, cfg, enc, enc_len, args.max_symbols, hyps, plain_logs)
        t_e2e, _ = median_seconds(
            lambda: graph.transcribe_batch(audios, batch_size=batch, max_symbols=args.max_symbols), args.repeats, device)
        tokens = sum(len(h.tokens) for h in hyps)
        rows.append((batch, total_audio, tokens, t_feat, t_enc, flops, t_graph, t_kstep, t_eager, t_plain_all, t_e2e,
                     n_plain < batch))
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print()
    print(f"{'batch':>5} {'audio s':>8} {'tokens':>7} | {'decode: graph':>13} {'K-step':>9} {'eager':>8} {'plain':>9} "
          f"{'speedup':>8} | "
          f"{'e2e audio-s/s: ostinato':>23} {'plain':>8} | {'features':>8} | {'encoder':>8} {'TFLOP/s':>8} {'of peak':>7}")
    for (batch, audio, tokens, t_feat, t_enc, flops, t_graph, t_kstep, t_eager, t_plain, t_e2e, scaled) in rows:
        plain_e2e = audio / (t_feat + t_enc + t_plain)
        mark = "*" if scaled else " "
        print(f"{batch:>5} {audio:>8.0f} {tokens:>7} | {t_graph * 1e3:>10.1f} ms {t_kstep * 1e3:>6.1f} ms "
              f"{t_eager * 1e3:>5.0f} ms "
              f"{t_plain * 1e3:>6.0f} ms{mark} {t_plain / t_graph:>7.1f}x | {audio / t_e2e:>23.0f} {plain_e2e:>8.0f} | "
              f"{t_feat * 1e3:>5.0f} ms | {t_enc * 1e3:>5.0f} ms {flops / t_enc / 1e12:>8.1f} {flops / t_enc / rate:>6.1%}")
    print("\n* plain-loop time measured on the first --plain-limit utterances and scaled to the batch")
    print(f"memory: {graph.memory_report()}")


if __name__ == "__main__":
    main()
