"""Build the tiny random-weight NeMo transducers and NeMo's reference decodes for the tests.

Run in a separate environment with NeMo installed (CI never installs it: it is large):

    python3.11 -m venv /work/nemo-venv
    /work/nemo-venv/bin/pip install torch==2.13.0            # CPU build
    /work/nemo-venv/bin/pip install 'nemo_toolkit[asr]==3.0.0'
    /work/nemo-venv/bin/python dev/make_transducer_models.py

Writes tests/data/transducer/:
    tiny_rnnt.nemo, tiny_tdt.nemo     FastConformer RNN-T / TDT, random weights, SentencePiece BPE
    refs.json                         NeMo 3.0.0 greedy_batch (label looping) tokens, frames, TDT
                                      durations and text, per model, max_symbols and batch layout
    stages.npz                        preprocessor features and encoder output for one input, and
                                      the synthetic input signals (int16)

The joint's output bias is tuned so that both blanks and labels occur (random weights otherwise
emit one symbol everywhere), and for TDT so that duration 0 occurs too (it counts against
max_symbols). Durations come from batch-size-1 runs: NeMo 3.0.0's batched TDT decoder records, for
a row that found its label before others, the duration of a later joint evaluation (a NeMo bug,
reported upstream); its tokens and frames are right, so those are recorded from batched runs as well.
"""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "transducer"
CLIPS = ROOT / "tests" / "data" / "clips"
CLIP_NAMES = ("c01_hello_short", "c03_questions_f3", "c06_pink10_scotland", "c04_names_rp", "c02_numbers")
MAX_SYMBOLS = (1, 2, 10)
DURATIONS = [0, 1, 2, 3, 4]
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "hello world this is a tiny transducer model",
    "numbers one two three four five six seven eight nine ten",
    "she sells sea shells by the sea shore",
    "how much wood would a woodchuck chuck",
    "a stitch in time saves nine",
    "parakeet models decode speech with label looping",
    "every frame may emit several labels before a blank",
]


def synthetic_signals() -> dict:
    """Short int16 test signals that exercise odd lengths: a chirp, noise bursts, a near-empty clip."""
    rng = np.random.default_rng(1234)
    sr = 16000
    t = np.arange(int(1.37 * sr)) / sr
    chirp = 0.4 * np.sin(2 * np.pi * (200 * t + 900 * t * t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    bursts = np.zeros(int(2.91 * sr))
    for start in range(0, bursts.size, 4000):
        n = min(1500, bursts.size - start)
        bursts[start:start + n] = 0.3 * rng.standard_normal(n)
    tiny = 0.05 * rng.standard_normal(int(0.21 * sr) + 7)
    return {
        name: np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)
        for name, x in (("syn_chirp", chirp), ("syn_bursts", bursts), ("syn_tiny", tiny))
    }


def load_inputs() -> dict:
    inputs = {}
    for name in CLIP_NAMES:
        pcm, sr = sf.read(str(CLIPS / f"{name}.flac"), dtype="int16")
        assert sr == 16000 and pcm.ndim == 1
        inputs[name] = pcm
    inputs.update(synthetic_signals())
    return inputs


def make_tokenizer(folder: Path, vocab_size: int = 40) -> Path:
    from nemo.collections.common.tokenizers.sentencepiece_tokenizer import create_spt_model

    text = folder / "text.txt"
    text.write_text("\n".join(SENTENCES * 4) + "\n")
    create_spt_model(str(text), vocab_size, sample_size=-1, do_lower_case=True, tokenizer_type="bpe",
                     output_dir=str(folder / "tok"))
    return folder / "tok"


def model_config(tokenizer_dir: Path, tdt: bool) -> dict:
    d = 48
    cfg = {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025, "window_stride": 0.01,
            "window": "hann", "features": 40, "n_fft": 512, "log": True, "frame_splicing": 1,
            "dither": 1e-5, "pad_to": 0, "pad_value": 0.0,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 40, "feat_out": -1, "n_layers": 2, "d_model": d, "use_bias": True,
            "subsampling": "dw_striding", "subsampling_factor": 8, "subsampling_conv_channels": 16,
            "causal_downsampling": False, "ff_expansion_factor": 4, "self_attention_model": "rel_pos",
            "n_heads": 4, "att_context_size": [-1, -1], "xscaling": True, "untie_biases": True,
            "pos_emb_max_len": 5000, "conv_kernel_size": 9, "conv_norm_type": "batch_norm",
            "dropout": 0.0, "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None, "random_state_sampling": False, "blank_as_pad": True,
            "prednet": {"pred_hidden": 32, "pred_rnn_layers": 2 if tdt else 1, "t_max": None, "dropout": 0.0},
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None, "preserve_memory": False, "fuse_loss_wer": False,
            "jointnet": {"joint_hidden": 40, "activation": "relu", "dropout": 0.0},
        },
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        "loss": {"loss_name": "default"},
        "model_defaults": {"enc_hidden": d, "pred_hidden": 32, "joint_hidden": 40},
    }
    if tdt:
        cfg["joint"]["num_extra_outputs"] = len(DURATIONS)
        cfg["decoding"].update({"model_type": "tdt", "durations": DURATIONS})
        cfg["loss"] = {"loss_name": "tdt", "tdt_kwargs": {"durations": DURATIONS, "sigma": 0.02, "omega": 0.1}}
        cfg["model_defaults"].update({"tdt_durations": DURATIONS, "num_tdt_durations": len(DURATIONS)})
    return cfg


def randomize(model, tdt: bool, seed: int) -> None:
    """Random weights with enough spread that the encoder output and the joint depend on the input."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("preprocessor"):
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / max(1, p.shape[-1]) ** 0.5 if p.dim() > 1 else 0.1))
        for name, b in model.named_buffers():  # batch-norm statistics, so folding is really tested
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
        embed = model.decoder.prediction["embed"]
        if embed.padding_idx is not None:  # the blank (start) embedding stays zero, as trained models keep it
            embed.weight[embed.padding_idx].zero_()
        out = model.joint.joint_net[-1]
        out.weight.mul_(4.0)
        # the encoder decides most of blank-or-label, the prediction net still matters
        model.joint.enc.weight.mul_(2.0)
        model.joint.pred.weight.mul_(0.4)


def tune_joint_bias(model, feats, tdt: bool, num_labels: int) -> None:
    """Set the blank (and duration) biases from the logit statistics over real encoder frames."""
    with torch.inference_mode():
        enc, enc_len = model.encoder(audio_signal=feats[0], length=feats[1])
        f = model.joint.project_encoder(enc.transpose(1, 2))
        g, _ = model.decoder.predict(None, None, add_sos=False, batch_size=1)
        g = model.joint.project_prednet(g)
        logits = model.joint.joint_net(f + g[:, :1])  # (B, T, V)
        labels = logits[..., : num_labels]
        blank = logits[..., num_labels]
        best_label = labels.max(-1).values
        gap = (best_label - blank).flatten()
        out = model.joint.joint_net[-1]
        # blank wins on about 55% of frames
        out.bias[num_labels] += float(torch.quantile(gap, 0.55))
        if tdt:
            dl = logits[..., num_labels + 1:]
            # make duration 0 win sometimes, 1-2 often, 3-4 sometimes
            means = dl.flatten(0, -2).mean(0)
            target = torch.tensor([0.6, 0.5, 0.5, 0.45, 0.4])
            out.bias[num_labels + 1:] += target - means


def decode_nemo(model, pcm_list, max_symbols: int, tdt: bool):
    from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTDecodingConfig

    cfg = OmegaConf.structured(RNNTDecodingConfig)
    cfg.strategy = "greedy_batch"
    cfg.greedy.max_symbols_per_step = max_symbols
    cfg.greedy.loop_labels = True
    cfg.greedy.use_cuda_graph_decoder = False
    if tdt:
        cfg.model_type = "tdt"
        cfg.durations = DURATIONS
        cfg.tdt_include_token_duration = True
    model.change_decoding_strategy(cfg, verbose=False)
    signals = [torch.from_numpy(p.astype(np.float32) / 32768.0) for p in pcm_list]
    lengths = torch.tensor([s.numel() for s in signals])
    batch = torch.zeros(len(signals), int(lengths.max()))
    for i, s in enumerate(signals):
        batch[i, : s.numel()] = s
    with torch.inference_mode():
        enc, enc_len = model.forward(input_signal=batch, input_signal_length=lengths)
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True
        )
    if isinstance(hyps, tuple):
        hyps = hyps[0]
    results = []
    for h, n in zip(hyps, enc_len.tolist()):
        item = {
            "tokens": [int(x) for x in h.y_sequence],
            "frames": [int(x) for x in h.timestamp],
            "text": h.text if isinstance(h.text, str) else model.tokenizer.ids_to_text([int(x) for x in h.y_sequence]),
            "encoded_length": int(n),
        }
        if tdt:
            item["durations"] = [int(x) for x in h.token_duration]
        results.append(item)
    return results


def build(kind: str, tok_dir: Path, inputs: dict, seed: int):
    from nemo.collections.asr.models import EncDecRNNTBPEModel

    tdt = kind == "tdt"
    cfg = OmegaConf.create(model_config(tok_dir, tdt))
    model = EncDecRNNTBPEModel(cfg=cfg)
    model.eval()
    randomize(model, tdt, seed)
    num_labels = model.tokenizer.vocab_size
    pcm = inputs["c04_names_rp"]
    sig = torch.from_numpy(pcm.astype(np.float32) / 32768.0)[None]
    feats = model.preprocessor(input_signal=sig, length=torch.tensor([sig.shape[1]]))
    tune_joint_bias(model, feats, tdt, num_labels)
    # Then move the blank bias until real decoding emits about 0.45 labels per encoder frame, and for
    # TDT the duration-0 bias until about a third of the labels have duration 0 (so max_symbols
    # matters); the two interact, so alternate a few rounds.
    probe = [inputs["c04_names_rp"], inputs["c03_questions_f3"]]
    bias = model.joint.joint_net[-1].bias
    for _ in range(3 if tdt else 1):
        lo, hi = float(bias[num_labels]) - 20.0, float(bias[num_labels]) + 20.0
        for _ in range(18):
            mid = 0.5 * (lo + hi)
            with torch.no_grad():
                bias[num_labels] = mid
            res = decode_nemo(model, probe, 10, tdt)
            rate = sum(len(r["tokens"]) for r in res) / sum(r["encoded_length"] for r in res)
            lo, hi = (mid, hi) if rate > 0.45 else (lo, mid)
        print(f"  {kind}: blank bias {mid:.3f}, labels per frame {rate:.2f}")
        if tdt:
            lo, hi = float(bias[num_labels + 1]) - 5.0, float(bias[num_labels + 1]) + 5.0
            for _ in range(14):
                mid = 0.5 * (lo + hi)
                with torch.no_grad():
                    bias[num_labels + 1] = mid
                durs = decode_nemo(model, probe[:1], 10, tdt)[0]["durations"]
                zero = sum(d == 0 for d in durs) / max(1, len(durs))
                lo, hi = (mid, hi) if zero < 0.33 else (lo, mid)
            hist = np.bincount(durs, minlength=len(DURATIONS)).tolist()
            print(f"  tdt: duration-0 bias {mid:.3f}, duration histogram {hist}")
    return model


def main() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    inputs = load_inputs()
    order = list(inputs)
    refs = {"nemo_version": None, "inputs": {}, "models": {}}
    import nemo

    refs["nemo_version"] = nemo.__version__
    for name, pcm in inputs.items():
        refs["inputs"][name] = {
            "source": "clip" if name in CLIP_NAMES else "stages.npz",
            "samples": int(pcm.size),
            "checksum": int(pcm.astype(np.int64).sum()),
        }
    stages = {f"input_{k}": v for k, v in inputs.items() if k.startswith("syn_")}
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = make_tokenizer(Path(tmp))
        for seed, kind in ((11, "rnnt"), (22, "tdt")):
            tdt = kind == "tdt"
            model = build(kind, tok_dir, inputs, seed)
            path = OUT / f"tiny_{kind}.nemo"
            model.save_to(str(path))
            print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB")
            entry = {"vocab_size": model.tokenizer.vocab_size, "decodes": []}
            # Batch layouts: every input alone, and two mixed batches (long and short together).
            layouts = [[n] for n in order] + [
                ["c02_numbers", "c01_hello_short", "syn_tiny", "c06_pink10_scotland"],
                ["syn_chirp", "c03_questions_f3", "syn_bursts", "c04_names_rp", "c01_hello_short"],
            ]
            for ms in MAX_SYMBOLS:
                singles = {}
                for layout in layouts:
                    res = decode_nemo(model, [inputs[n] for n in layout], ms, tdt)
                    if len(layout) == 1:
                        singles[layout[0]] = res[0]
                    else:
                        for n, r in zip(layout, res):
                            # tokens and frames from the batch must equal the single run
                            s = singles[n]
                            assert r["tokens"] == s["tokens"] and r["frames"] == s["frames"], (kind, ms, n)
                            if tdt:
                                r["durations_batched_nemo"] = r.pop("durations")
                                r["durations"] = s["durations"]
                    entry["decodes"].append({"max_symbols": ms, "batch": layout, "results": res})
                stats = [len(singles[n]["tokens"]) / max(1, singles[n]["encoded_length"]) for n in order]
                print(f"  {kind} max_symbols={ms}: tokens/frame " + " ".join(f"{x:.2f}" for x in stats))
            refs["models"][kind] = entry
            # Stage references: features and encoder output for one short input.
            pcm = inputs["c01_hello_short"]
            sig = torch.from_numpy(pcm.astype(np.float32) / 32768.0)[None]
            with torch.inference_mode():
                feats, flen = model.preprocessor(input_signal=sig, length=torch.tensor([sig.shape[1]]))
                enc, elen = model.encoder(audio_signal=feats, length=flen)
            stages[f"{kind}_features"] = feats[0].numpy().astype(np.float32)
            stages[f"{kind}_features_length"] = np.array(int(flen[0]))
            stages[f"{kind}_encoder"] = enc[0].numpy().astype(np.float32)
            stages[f"{kind}_encoder_length"] = np.array(int(elen[0]))
    np.savez_compressed(OUT / "stages.npz", **stages)
    (OUT / "refs.json").write_text(json.dumps(refs, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"total {total / 1024:.0f} KiB in {OUT}")


if __name__ == "__main__":
    main()
