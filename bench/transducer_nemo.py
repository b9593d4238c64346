"""NVIDIA NeMo 3.0.0 beside ostinato, same random weights, Parakeet-TDT-0.6B-v2's shape, one process.

    PYTHONPATH=src:/tmp/nemo_lib python bench/transducer_nemo.py [--batches 1 32 128] [--dtype float16]
    # CPU smoke test (float32, one encoder layer):
    PYTHONPATH=src python bench/transducer_nemo.py --device cpu --dtype float32 --layers 1 --batches 2 \\
        --min-seconds 2 --max-seconds 4 --repeats 1

NeMo: an ``EncDecRNNTBPEModel`` (FastConformer 24 x 1024, 8 heads, FF 4096, conv kernel 9, dw_striding x8
with 256 channels, 128 mels; 2-layer LSTM prediction net 640, joint 640, 1024 SentencePiece labels +
blank, TDT durations 0-4) built from its config, with a 1024-piece tokenizer trained on synthetic text
in a temporary folder. Its weights are random as ``ostinato.testing.random_models`` makes them
(prediction net, joint edits) and a forward hook writes the same fixed blank/label/duration pattern
on reserved encoder channels, so decoding emits labels on about 30% of frames. ostinato's model is
loaded from NeMo's state dict and config by ostinato's own loader, with the same hook.

NeMo decodes as it does for speed: greedy_batch, label looping, its CUDA-graph decoder, max_symbols
10. End to end = features + encoder + decoding from the samples, as NeMo's transcribe runs a
float32 model with mixed precision (``torch.autocast`` in float16 or bfloat16), under
``torch.inference_mode``; with a half-precision --dtype a second NeMo column runs its encoder,
prediction net and joint in that dtype (the preprocessor stays float32, as NeMo keeps it).
Decode alone = ``rnnt_decoder_predictions_tensor`` on NeMo's own encoder output against
``decoder.decode`` on ostinato's. Times are medians over --repeats after one warm-up run. Tokens
and frames are compared end to end, and for the two decoders on one encoder output (ostinato's).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import tempfile
from contextlib import contextmanager, nullcontext
from operator import eq
from pathlib import Path

import numpy as np
import torch

from ostinato.models.transducer.model import TransducerModel, TransducerNetwork
from ostinato.models.transducer.nemo_checkpoint import parse_config
from ostinato.models.transducer.tokenizer import SentencePieceDecoder
from ostinato.testing.measure import median_seconds
from ostinato.testing.random_models import (
    BLANK_UNIT, DUR_UNIT0, LABEL_UNIT, install_pattern, parakeet_tdt_v2_config, pattern,
)

SAMPLE_RATE = 16000


def train_tokenizer(folder: Path, pieces: int) -> Path:
    """A SentencePiece BPE model of exactly ``pieces`` pieces, trained on made-up words."""
    from nemo.collections.common.tokenizers.sentencepiece_tokenizer import create_spt_model

    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(6000)})
    text = folder / "text.txt"
    text.write_text("\n".join(" ".join(rng.choices(words, k=12)) for _ in range(20000)) + "\n")
    # SentencePiece's trainer logs every merge on file descriptor 2: silenced while it runs
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        create_spt_model(str(text), pieces, sample_size=-1, do_lower_case=True, tokenizer_type="bpe",
                         output_dir=str(folder / "tok"))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    return folder / "tok"


def nemo_config(cfg, tokenizer_dir: Path) -> dict:
    """NeMo's model config for ostinato's TransducerConfig ``cfg`` (FastConformer TDT, full context)."""
    p, e = cfg.preprocessor, cfg.encoder
    return {
        "sample_rate": p.sample_rate,
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": p.sample_rate, "normalize": p.normalize, "window_size": p.win_length / p.sample_rate,
            "window_stride": p.hop_length / p.sample_rate, "window": p.window, "features": p.features,
            "n_fft": p.n_fft, "log": p.log, "frame_splicing": 1, "dither": 1e-5, "pad_to": p.pad_to,
            "pad_value": p.pad_value,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": e.feat_in, "feat_out": -1, "n_layers": e.n_layers, "d_model": e.d_model,
            "use_bias": e.use_bias, "subsampling": "dw_striding", "subsampling_factor": e.subsampling_factor,
            "subsampling_conv_channels": e.subsampling_conv_channels, "causal_downsampling": False,
            "ff_expansion_factor": e.ff_expansion_factor, "self_attention_model": "rel_pos", "n_heads": e.n_heads,
            "att_context_size": [-1, -1], "xscaling": e.xscaling, "untie_biases": e.untie_biases,
            "pos_emb_max_len": 5000, "conv_kernel_size": e.conv_kernel_size, "conv_norm_type": "batch_norm",
            "dropout": 0.0, "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None, "random_state_sampling": False, "blank_as_pad": True,
            "prednet": {"pred_hidden": cfg.pred_hidden, "pred_rnn_layers": cfg.pred_layers, "t_max": None,
                        "dropout": 0.0},
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None, "preserve_memory": False, "fuse_loss_wer": False,
            "num_extra_outputs": len(cfg.durations),
            "jointnet": {"joint_hidden": cfg.joint_hidden, "activation": cfg.joint_activation, "dropout": 0.0},
        },
        "decoding": {"strategy": "greedy_batch", "model_type": "tdt", "durations": cfg.durations,
                     "greedy": {"max_symbols": cfg.max_symbols}},
        "loss": {"loss_name": "tdt", "tdt_kwargs": {"durations": cfg.durations, "sigma": 0.02, "omega": 0.1}},
        "model_defaults": {"enc_hidden": e.d_model, "pred_hidden": cfg.pred_hidden, "joint_hidden": cfg.joint_hidden,
                           "tdt_durations": cfg.durations, "num_tdt_durations": len(cfg.durations)},
    }


def randomize(model, cfg, seed: int = 0) -> None:
    """NeMo's default init, plus what ``random_transducer_network`` does to ostinato's modules (the
    prediction net's init, and the joint units that read the pattern channels); batch norms get
    random statistics and affine values (ostinato folds them: a real test of that)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.encoder.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
        for name, p in model.encoder.named_parameters():
            if name.endswith(("pos_bias_u", "pos_bias_v")):  # NeMo starts them at zero
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        h = cfg.pred_hidden
        for name, p in model.decoder.prediction["dec_rnn"].lstm.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(h) if name.startswith("weight") else 0 * p)
        embed = model.decoder.prediction["embed"]
        embed.weight.copy_(0.5 * torch.randn(embed.weight.shape, generator=gen))
        embed.weight[cfg.blank_id].zero_()
        joint, out = model.joint, model.joint.joint_net[-1]
        k = DUR_UNIT0 + len(cfg.durations)
        for lin in (joint.enc, joint.pred):  # the pattern units read only their encoder channel
            lin.weight[:k].zero_()
            lin.bias[:k].zero_()
        for u in range(k):
            joint.enc.weight[u, u] = 1.0
        out.weight[:, :k].zero_()
        big = 50.0
        out.weight[cfg.blank_id, BLANK_UNIT] = big
        out.weight[: cfg.vocab_size, LABEL_UNIT] = big
        for j in range(len(cfg.durations)):
            out.weight[cfg.vocab_size + 1 + j, DUR_UNIT0 + j] = big


def install_nemo_pattern(model, seed: int = 1) -> None:
    """``install_pattern``'s table on NeMo's encoder output, which is [B, D, T] (ostinato's is [B, T, D])."""
    table = pattern(100_000, seed).t().contiguous()

    def hook(module, inputs, output):
        x, lengths = output
        x = x.clone()
        x[:, : table.shape[0], :] = table[:, : x.shape[2]].to(x.device, x.dtype)[None]
        return x, lengths

    model.encoder.register_forward_hook(hook)


def set_nemo_decoding(model, cfg, cuda: bool) -> None:
    from omegaconf import OmegaConf

    from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTDecodingConfig

    d = OmegaConf.structured(RNNTDecodingConfig)
    d.strategy = "greedy_batch"
    d.model_type = "tdt"
    d.durations = list(cfg.durations)
    d.greedy.max_symbols_per_step = cfg.max_symbols
    d.greedy.loop_labels = True
    d.greedy.use_cuda_graph_decoder = cuda  # NeMo's graphs are CUDA-only
    model.change_decoding_strategy(d, verbose=False)


def graphs_mode(model) -> str:
    computer = getattr(model.decoding.decoding, "decoding_computer", None)
    mode = getattr(computer, "cuda_graphs_mode", None)
    return "off" if mode is None else str(getattr(mode, "value", mode))


def ints(x) -> list:
    return x.tolist() if torch.is_tensor(x) else [int(v) for v in x]


def as_pairs(hyps) -> list:
    """(tokens, frames) per NeMo hypothesis (its batched TDT durations are unreliable: not compared)."""
    return [(ints(h.y_sequence), ints(h.timestamp)) for h in hyps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--min-seconds", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--layers", type=int, default=None, help="override the encoder depth (CPU smoke tests)")
    args = ap.parse_args()
    if args.device == "cpu" and args.dtype != "float32":
        # ostinato computes float32 on the CPU anyway; NeMo's LSTM fails under CPU autocast (oneDNN)
        ap.error("on the CPU only --dtype float32 runs")

    import nemo
    from omegaconf import OmegaConf

    from nemo.collections.asr.models import EncDecRNNTBPEModel

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    half = None if args.dtype == "float32" else getattr(torch, args.dtype)
    expected = parakeet_tdt_v2_config()
    if args.layers is not None:
        expected.encoder.n_layers = args.layers
    tmp = tempfile.TemporaryDirectory()
    tok_dir = train_tokenizer(Path(tmp.name), expected.vocab_size)
    torch.manual_seed(0)
    nemo_model = EncDecRNNTBPEModel(cfg=OmegaConf.create(nemo_config(expected, tok_dir))).eval()
    # ostinato reads the model's config as it reads a .nemo file's model_config.yaml
    cfg = parse_config(OmegaConf.to_container(nemo_model.cfg, resolve=True))
    assert dataclasses.asdict(cfg) == dataclasses.asdict(expected), (cfg, expected)
    randomize(nemo_model, cfg)
    state = {k: v.detach().clone() for k, v in nemo_model.state_dict().items()}
    install_nemo_pattern(nemo_model)
    nemo_model.to(device)
    set_nemo_decoding(nemo_model, cfg, cuda)

    net = TransducerNetwork.from_nemo(cfg, state)
    del state
    install_pattern(net)
    tokenizer = SentencePieceDecoder.from_bytes((tok_dir / "tokenizer.model").read_bytes())
    tmp.cleanup()
    ours = TransducerModel.from_network(net, cfg, tokenizer, device=args.device, compute_type=args.dtype)
    params = sum(p.numel() for p in net.parameters())

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device: {name}, torch {torch.__version__}, nemo {nemo.__version__}, {args.dtype}")
    print(f"model: Parakeet-TDT-0.6B-v2 architecture ({cfg.encoder.n_layers} encoder layers), random weights, "
          f"{params / 1e6:.0f}M parameters; ostinato decode loop: {ours.decoder.loop_rung}")

    rng = np.random.default_rng(0)  # the audio of bench/transducer_gpu.py
    batches = []
    for batch in args.batches:
        seconds = rng.uniform(args.min_seconds, args.max_seconds, batch)
        batches.append([(0.1 * rng.standard_normal(int(s * SAMPLE_RATE))).astype(np.float32) for s in seconds])

    def upload(audios):
        lengths = torch.tensor([a.shape[0] for a in audios])
        host = torch.zeros(len(audios), int(lengths.max()), pin_memory=cuda)
        for i, a in enumerate(audios):
            host[i, : a.shape[0]] = torch.from_numpy(a)
        return host.to(device, non_blocking=cuda), lengths.to(device)

    def timed(fn):
        fn()  # warm-up: NeMo captures its graphs for this shape, ostinato its bucket
        return median_seconds(fn, args.repeats, device)

    def nemo_run(audios, precision, ours_enc):
        """NeMo end to end and decode alone; (tokens, frames) end to end and on ostinato's encoder output.
        precision: None (weights as they are) or the autocast dtype, as NeMo's transcribe uses it."""
        @contextmanager
        def context():
            with torch.inference_mode(), (torch.autocast(device.type, dtype=precision) if precision else nullcontext()):
                yield

        dtype = next(nemo_model.encoder.parameters()).dtype

        def e2e():
            with context():
                signal, lengths = upload(audios)
                feats, feat_len = nemo_model.preprocessor(input_signal=signal, length=lengths)  # float32 always
                enc, enc_len = nemo_model.encoder(audio_signal=feats.to(dtype), length=feat_len)
                hyps = nemo_model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True)
            return hyps, enc, enc_len

        def decode(enc, enc_len):
            with context():
                return nemo_model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True)

        t_e2e, (hyps, enc, enc_len) = timed(e2e)
        t_dec, _ = timed(lambda: decode(enc, enc_len))
        shared = decode(ours_enc[0].transpose(1, 2).to(dtype), ours_enc[1])  # the decoders alone, same input
        return {"e2e": t_e2e, "dec": t_dec, "pairs": as_pairs(hyps), "shared": as_pairs(shared),
                "mode": graphs_mode(nemo_model)}

    results = []  # per batch: ostinato's times and tokens, then one entry per NeMo column
    for audios in batches:
        t_e2e, out = timed(lambda: ours.transcribe_batch(audios, batch_size=len(audios)))
        with torch.inference_mode():
            enc = ours.encode(*ours.features(audios))
        t_dec, hyps = timed(lambda: ours.decoder.decode(*enc, cfg.max_symbols))
        results.append({"audio": sum(a.shape[0] for a in audios) / SAMPLE_RATE, "e2e": t_e2e, "dec": t_dec,
                        "pairs": [(r.tokens, r.frames) for r in out], "shared": [(h.tokens, h.frames) for h in hyps],
                        "enc": enc, "nemo": {}})

    # NeMo as its transcribe runs a float32 model: autocast to the half dtype (or plain float32)
    columns = [(f"NeMo {'autocast' if half is not None else 'fp32'}", half)]
    if half is not None:  # and with its encoder, prediction net and joint in the half dtype
        columns.append((f"NeMo {args.dtype}", None))
    for column, precision in columns:
        if precision is None and half is not None:
            for module in (nemo_model.encoder, nemo_model.decoder, nemo_model.joint):
                module.to(half)
            set_nemo_decoding(nemo_model, cfg, cuda)  # a fresh decoding computer for the new dtype
        for r, audios in zip(results, batches):
            try:
                r["nemo"][column] = nemo_run(audios, precision, r["enc"])
            except Exception as exc:  # say why, keep the other columns
                print(f"{column} failed at batch {len(audios)}: {type(exc).__name__}: {exc}".splitlines()[0])
                break
            n = r["nemo"][column]
            print(f"batch {len(audios)}, {column}: {n['e2e']:.3f} s end to end (ostinato {r['e2e']:.3f} s), "
                  f"decode {n['dec'] * 1e3:.1f} ms (ostinato {r['dec'] * 1e3:.1f} ms)", flush=True)
            if cuda:
                torch.cuda.empty_cache()

    names = [c for c, _ in columns]
    print(f"\nNeMo's decoder: greedy_batch, label looping, max_symbols {cfg.max_symbols}, CUDA graphs: "
          + ", ".join(f"{c} {results[0]['nemo'][c]['mode']}" for c in names if c in results[0]["nemo"]))
    print("end to end in audio-s/s; decode alone in ms; speedup against the faster NeMo; same: utterances whose "
          "tokens and frames equal ostinato's, end to end and for the decoders on one encoder output (ostinato's)")
    header = ["batch", "audio s", "tokens"] + [f"{c} e2e" for c in names] + ["ostinato e2e", "speedup"] + \
             [f"{c} dec" for c in names] + ["ostinato dec", "speedup"] + \
             [f"same {c.split()[-1]}: e2e, enc" for c in names]
    table = []
    for r in results:
        batch = len(r["pairs"])
        nemo = [r["nemo"].get(c) for c in names]
        e2e = min((n["e2e"] for n in nemo if n), default=math.nan)
        dec = min((n["dec"] for n in nemo if n), default=math.nan)
        table.append([str(batch), f"{r['audio']:.0f}", str(sum(len(t) for t, _ in r["pairs"]))]
                     + [f"{r['audio'] / n['e2e']:.0f}" if n else "-" for n in nemo]
                     + [f"{r['audio'] / r['e2e']:.0f}", f"{e2e / r['e2e']:.1f}x"]
                     + [f"{n['dec'] * 1e3:.1f}" if n else "-" for n in nemo]
                     + [f"{r['dec'] * 1e3:.1f}", f"{dec / r['dec']:.1f}x"]
                     + [f"{sum(map(eq, n['pairs'], r['pairs']))}/{batch}, {sum(map(eq, n['shared'], r['shared']))}/{batch}"
                        if n else "-" for n in nemo])
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    for row in [header] + table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    print(f"medians of {args.repeats} after one warm-up; ostinato memory: {ours.memory_report()}")


if __name__ == "__main__":
    main()
