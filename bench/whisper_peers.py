"""The peers of ostinato's Whisper decoder for bench/whisper_gpu.py, on the same random weights.

    from whisper_peers import DIMS, hf_ms_per_step, openai_ms_per_step, ...   (weights: ostinato.testing)
    PYTHONPATH=src:.carry/pylib python bench/whisper_peers.py --smoke     (a short CPU self-check)

Three implementations decode the same forced number of tokens from the same float16 weights:
ostinato (timed by bench/whisper_gpu.py), Hugging Face transformers' ``generate`` with eager
attention, and openai-whisper's own ``whisper.decoding.decode`` with its kv-cache hooks. The
weights are random, in OpenAI's layout (the names of openai-whisper's ``Whisper`` module, which
ostinato's modules share); a name mapping builds the transformers model from the same tensors.

Every peer gets the same request:
  * prompt <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> (English-only
    vocabularies: <|startoftranscript|> <|notimestamps|>), no timestamp rules, greedy (T = 0);
  * suppressed ids: Whisper's non-speech set and the task/special tokens (what openai-whisper
    suppresses with suppress_tokens="-1") plus <|endoftext|>, so end-of-text is never chosen and
    every row runs exactly ``steps`` decoder steps; no blank suppression at the first step;
  * the encoder output is computed once before timing and handed to the decoder, so no timed
    call runs the encoder.

The transformers and openai-whisper imports stay inside the functions: this module imports with
torch and ostinato alone. On the GPU machine openai-whisper comes from .carry/pylib (made by
dev/carry_openai_whisper.py).
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ostinato.models.whisper.config import OFFICIAL_DIMS, WhisperDims
from ostinato.testing.measure import (
    copy_bandwidth_gbs, matmul_tflops, median_seconds, whisper_encoder_flops as encoder_flops,
)
from ostinato.testing.random_models import StateDict, random_mel, random_whisper_checkpoint

# Official sizes (OpenAI's dims: n_mels, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
# n_vocab, n_text_ctx, n_text_state, n_text_head, n_text_layer).
DIMS: Dict[str, WhisperDims] = {name: OFFICIAL_DIMS[name] for name in ("tiny", "small", "large-v3")}
assert DIMS["tiny"] == WhisperDims(80, 1500, 384, 6, 4, 51865, 448, 384, 6, 4)
assert DIMS["small"] == WhisperDims(80, 1500, 768, 12, 12, 51865, 448, 768, 12, 12)
assert DIMS["large-v3"] == WhisperDims(128, 1500, 1280, 20, 32, 51866, 448, 1280, 20, 32)



# -- weights ------------------------------------------------------------------------------------
def save_openai_checkpoint(dims: WhisperDims, state_dict: StateDict, path) -> Path:
    """Write an OpenAI ``.pt``: {"dims": {...}, "model_state_dict": {...}} (CPU tensors).

    Loads with ostinato's ``WhisperModel(path)`` (its OpenAI loader checks the exact tensor set)
    and with openai-whisper's ``whisper.load_model(path)`` (a strict load_state_dict).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"dims": dims.to_dict(), "model_state_dict": {k: v.cpu() for k, v in state_dict.items()}}, path)
    return path


# -- the request every peer gets -------------------------------------------------------------
@dataclass(frozen=True)
class SpecialIds:
    eot: int
    sot: int
    sot_prev: int
    sot_lm: int
    no_timestamps: int
    transcribe: int
    translate: int
    english: Optional[int]  # <|en|>; None for English-only vocabularies
    prompt: Tuple[int, ...]  # the forced-length request's prompt (see the module docstring)
    suppress: Tuple[int, ...]  # non-speech + task/special tokens + end-of-text, sorted


@lru_cache(maxsize=None)
def special_ids(dims: WhisperDims) -> SpecialIds:
    """The token ids of the request, from ostinato's copy of Whisper's vocabulary for n_vocab."""
    from ostinato.models.whisper.loaders.vocab import whisper_tokenizer_file
    from ostinato.models.whisper.tokenizer import WhisperTokenizer

    tok = WhisperTokenizer(whisper_tokenizer_file(dims.n_vocab), dims.is_multilingual, dims.num_languages)
    english = tok.language_token("en") if dims.is_multilingual else None
    prompt = tuple(tok.sot_sequence("en", "transcribe")) + (tok.no_timestamps,)
    suppress = tuple(sorted(set(tok.suppressed_tokens([-1])) | {tok.eot}))
    return SpecialIds(tok.eot, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_timestamps, tok.transcribe,
                      tok.translate, english, prompt, suppress)


# -- timing -----------------------------------------------------------------------------------
def _per_step_ms(run: Callable[[int], List[List[int]]], steps: int, repeats: int, device, method: str) -> float:
    """ms per decode step of ``run(n)``, a decode of ``n`` forced tokens per row (encoder excluded).

    Why "total" is the default: ``run`` starts from the encoder output, so (time of one call) /
    steps is the decoder's cost per token of a window, including its once-per-window work (the
    prompt's prefill, the cross-attention K/V projections, setup and collecting the tokens). That
    is the measure bench/whisper_decode_step.py takes of ostinato (one decode call from the
    encoder output, divided by the steps), so ostinato timed that way compares like with like;
    and no encoder time has to be subtracted, which would add the noise of a second measurement.
    Every implementation decodes the same positions (same prompt, same steps), so the growing
    self-attention cache weighs the same in each.
    "difference" reports (T(steps) - T(steps // 4)) / (steps - steps // 4): the steady-state step
    alone, without the per-window costs; use it to see how much of "total" they are.
    One untimed call first warms up (allocator, cuBLAS handles, kernel selection).
    """
    def checked(n: int) -> Callable[[], List[List[int]]]:
        return lambda: run(n)

    def check(rows: List[List[int]], n: int) -> None:
        lengths = sorted({len(r) for r in rows})
        if lengths != [n]:
            raise RuntimeError(f"forced length not reached: asked for {n} tokens per row, got {lengths}")

    check(run(steps), steps)  # warm-up, and the forced length is checked once per configuration
    seconds, rows = median_seconds(checked(steps), repeats, device)
    check(rows, steps)
    if method == "total":
        return seconds * 1e3 / steps
    if method == "difference":
        short = max(1, steps // 4)
        if short >= steps:
            raise ValueError("method='difference' needs steps >= 2")
        check(run(short), short)
        short_seconds, rows = median_seconds(checked(short), repeats, device)
        check(rows, short)
        return (seconds - short_seconds) * 1e3 / (steps - short)
    raise ValueError(f"unknown method {method!r}: 'total' or 'difference'")


# -- Hugging Face transformers ---------------------------------------------------------------
def hf_name(name: str) -> str:
    """An OpenAI-layout parameter name -> transformers' WhisperForConditionalGeneration name."""
    parts = name.split(".")
    side = parts[0]  # encoder | decoder
    top = {
        "conv1": "conv1", "conv2": "conv2", "positional_embedding": "embed_positions",
        "ln_post": "layer_norm", "ln": "layer_norm", "token_embedding": "embed_tokens",
    }
    if parts[1] != "blocks":
        out = [top[parts[1]]] + parts[2:]
        if parts[1] == "positional_embedding":
            out = ["embed_positions", "weight"]
        return ".".join(["model", side] + out)
    layer, rest = parts[2], parts[3:]
    blocks = {
        "attn": "self_attn", "cross_attn": "encoder_attn", "attn_ln": "self_attn_layer_norm",
        "cross_attn_ln": "encoder_attn_layer_norm", "mlp_ln": "final_layer_norm",
    }
    projections = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
    if rest[0] == "mlp":
        out = [{"0": "fc1", "2": "fc2"}[rest[1]], rest[2]]
    elif rest[0] in ("attn", "cross_attn"):
        out = [blocks[rest[0]], projections[rest[1]], rest[2]]
    else:
        out = [blocks[rest[0]], rest[1]]
    return ".".join(["model", side, "layers", layer] + out)


def hf_state_dict(state_dict: StateDict) -> StateDict:
    """The same tensors (not copies) under transformers' names; proj_out shares the embedding."""
    out = {hf_name(k): v for k, v in state_dict.items()}
    out["proj_out.weight"] = out["model.decoder.embed_tokens.weight"]
    return out


def hf_config(dims: WhisperDims):
    """transformers' WhisperConfig of ``dims``, eager attention."""
    from transformers import WhisperConfig

    if dims.n_audio_state != dims.n_text_state:
        raise ValueError("transformers' Whisper has one d_model for encoder and decoder")
    ids = special_ids(dims)
    config = WhisperConfig(
        vocab_size=dims.n_vocab, num_mel_bins=dims.n_mels, d_model=dims.n_audio_state,
        encoder_layers=dims.n_audio_layer, encoder_attention_heads=dims.n_audio_head,
        decoder_layers=dims.n_text_layer, decoder_attention_heads=dims.n_text_head,
        encoder_ffn_dim=4 * dims.n_audio_state, decoder_ffn_dim=4 * dims.n_text_state,
        max_source_positions=dims.n_audio_ctx, max_target_positions=dims.n_text_ctx,
        activation_function="gelu", scale_embedding=False, tie_word_embeddings=True,
        decoder_start_token_id=ids.sot, pad_token_id=ids.eot, bos_token_id=ids.eot, eos_token_id=ids.eot,
        suppress_tokens=None, begin_suppress_tokens=None,
    )
    config._attn_implementation = "eager"
    return config


def hf_generation_config(dims: WhisperDims):
    """A generation config as Whisper's hub checkpoints carry, set up for the forced-length request."""
    from transformers import GenerationConfig

    ids = special_ids(dims)
    extra = {}
    if dims.is_multilingual:
        extra = dict(lang_to_id={"<|en|>": ids.english},
                     task_to_id={"transcribe": ids.transcribe, "translate": ids.translate})
    return GenerationConfig(
        decoder_start_token_id=ids.sot, eos_token_id=ids.eot, pad_token_id=ids.eot, bos_token_id=ids.eot,
        max_length=dims.n_text_ctx, no_timestamps_token_id=ids.no_timestamps, prev_sot_token_id=ids.sot_prev,
        is_multilingual=dims.is_multilingual, suppress_tokens=list(ids.suppress), begin_suppress_tokens=None,
        return_timestamps=False, do_sample=False, num_beams=1, **extra,
    )


def build_hf_model(dims: WhisperDims, state_dict: StateDict, device, dtype):
    """transformers' WhisperForConditionalGeneration on ``device``/``dtype`` around the given weights."""
    from transformers import WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    # Quiet its per-call notices (deprecations, "attention mask not set": no row is padded here).
    hf_logging.set_verbosity_error()
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(hf_config(dims))
    weights = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
    state = hf_state_dict(weights)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise KeyError(f"OpenAI->HF mapping does not match: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.proj_out.weight = model.model.decoder.embed_tokens.weight  # tied, as in hub checkpoints
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"tensors left on the meta device: {left[:4]}")
    model.generation_config = hf_generation_config(dims)
    return model.eval()


def hf_encode(model, mel: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        p = model.model.encoder.conv1.weight
        return model.model.encoder(mel.to(p.device, p.dtype)).last_hidden_state


def hf_generate(model, dims: WhisperDims, features: torch.Tensor, steps: int) -> List[List[int]]:
    """Greedy ``generate`` from the encoder output: ``steps`` new tokens per row (end-of-text suppressed)."""
    from transformers.modeling_outputs import BaseModelOutput

    kwargs = dict(language="en", task="transcribe") if dims.is_multilingual else {}
    config = copy.deepcopy(model.generation_config)  # generate edits the config it is given
    # <|endoftext|> is in suppress_tokens, so max_new_tokens alone fixes the length. (min_new_tokens
    # would add a second per-step processor masking it again; openai-whisper runs no such thing.)
    config.max_new_tokens = steps
    with torch.inference_mode():
        out = model.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=features), generation_config=config,
            return_timestamps=False, **kwargs,
        )
    sequences = out if isinstance(out, torch.Tensor) else out["sequences"]
    rows = sequences.tolist()
    prompt = list(special_ids(dims).prompt)
    # Short-form generate returns the prompt followed by the new tokens; strip the prompt if present.
    return [r[len(prompt):] if r[: len(prompt)] == prompt else r for r in rows]


def hf_ms_per_step(
    dims: WhisperDims, state_dict: StateDict, batch: int, steps: int, repeats: int, device, dtype,
    method: str = "total", model=None, features: Optional[torch.Tensor] = None,
) -> float:
    """Median ms per decode step of transformers' eager ``generate`` (see _per_step_ms for what it holds).

    The length is forced by suppressing <|endoftext|> (in the generation config's suppress_tokens,
    with Whisper's usual set) and min_new_tokens = max_new_tokens = steps; every row's count is
    checked. The encoder runs once, untimed; ``generate`` gets its output as ``encoder_outputs``.
    Eager attention, the default dynamic KV cache, no compilation: transformers as shipped.
    ``model``/``features`` may be passed to reuse a built model or an encoder output.
    """
    device = torch.device(device)
    model = model if model is not None else build_hf_model(dims, state_dict, device, dtype)
    if features is None:
        features = hf_encode(model, random_mel(dims, batch))
    features = features.to(device, dtype)
    return _per_step_ms(lambda n: hf_generate(model, dims, features, n), steps, repeats, device, method)


# -- openai-whisper ---------------------------------------------------------------------------
def import_whisper():
    """openai-whisper (on the GPU machine from .carry/pylib: PYTHONPATH=src:.carry/pylib)."""
    try:
        import whisper
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"openai-whisper is not importable ({exc}): run dev/carry_openai_whisper.py here, carry "
            ".carry/pylib and put it on PYTHONPATH"
        ) from None
    return whisper


def build_openai_model(dims: WhisperDims, state_dict: StateDict, device, dtype, fp32_params: bool = False):
    """openai-whisper's ``Whisper`` on ``device`` with the given weights.

    openai-whisper keeps float32 parameters (``whisper.load_model`` leaves them so): its LayerNorm
    runs in float32 on float32 weights, and its Linear/Conv1d cast their weights to the input's
    dtype on every call. By default (fp32_params=False) the matmul weights (Linear, Conv1d,
    Embedding, the position tables) are stored in ``dtype`` already, so those casts are no-ops and
    each step reads the float16 weights once, as the other implementations do; only the layer
    norms keep float32 parameters, which its LayerNorm requires (a plain model.half() breaks it).
    fp32_params=True leaves the model as ``whisper.load_model`` gives it: openai-whisper as
    shipped, converting every weight to float16 on every call.
    """
    import_whisper()
    from torch import nn
    from whisper.model import ModelDimensions, Whisper

    with torch.device(device):
        model = Whisper(ModelDimensions(**dims.to_dict()))
    model.load_state_dict({k: v.to(device) for k, v in state_dict.items()})
    if not fp32_params and dtype != torch.float32:
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
                module.to(dtype)
        with torch.no_grad():
            model.decoder.positional_embedding.data = model.decoder.positional_embedding.data.to(dtype)
        model.encoder.positional_embedding = model.encoder.positional_embedding.to(dtype)
    return model.eval()


def openai_encode(model, mel: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The encoder output in ``dtype`` (default: the dtype of the conv weights; give float16 for a
    model with fp32_params)."""
    with torch.inference_mode():
        p = model.encoder.conv1.weight
        return model.encoder(mel.to(p.device, dtype or p.dtype))


def openai_options(dims: WhisperDims, steps: int, fp16: bool):
    """DecodingOptions forcing ``steps`` greedy tokens per row without timestamps."""
    from whisper.decoding import DecodingOptions

    ids = special_ids(dims)
    # An explicit list: openai-whisper adds its task/special tokens to it, as it does for "-1".
    return DecodingOptions(
        task="transcribe", language="en", temperature=0.0, sample_len=steps, beam_size=None, best_of=None,
        suppress_tokens=list(ids.suppress), suppress_blank=False, without_timestamps=True, fp16=fp16,
    )


def openai_decode(model, dims: WhisperDims, features: torch.Tensor, steps: int) -> List[List[int]]:
    """openai-whisper's ``decode`` from the encoder output: it skips its encoder when the input has
    the shape [B, n_audio_ctx, n_audio_state]."""
    from whisper.decoding import decode

    options = openai_options(dims, steps, fp16=features.dtype == torch.float16)
    return [r.tokens for r in decode(model, features, options)]


def openai_ms_per_step(
    dims: WhisperDims, state_dict: StateDict, batch: int, steps: int, repeats: int, device, dtype,
    method: str = "total", model=None, features: Optional[torch.Tensor] = None, fp32_params: bool = False,
) -> float:
    """Median ms per decode step of openai-whisper's ``whisper.decoding.decode`` (its kv-cache hooks).

    The length is forced by suppressing <|endoftext|> (suppress_tokens) with sample_len = steps:
    its loop then runs exactly ``steps`` decoder calls (the first one over the 4-token prompt);
    every row's count is checked. Greedy (temperature 0, no beams, no best-of), without timestamps,
    language "en" given (no language detection). The encoder runs once, untimed; decode gets its
    output, which openai-whisper accepts in place of a mel. The timed call also holds
    openai-whisper's per-call work: building the DecodingTask, the no-speech probability at the
    first step, and detokenising the texts at the end. ``fp32_params``: see build_openai_model.
    """
    device = torch.device(device)
    model = model if model is not None else build_openai_model(dims, state_dict, device, dtype, fp32_params)
    if features is None:
        features = openai_encode(model, random_mel(dims, batch), dtype)
    features = features.to(device, dtype)
    return _per_step_ms(lambda n: openai_decode(model, dims, features, n), steps, repeats, device, method)


# -- the machine's rates and the floors -------------------------------------------------------
def decoder_step_weights(dims: WhisperDims) -> int:
    """Parameters one decode step reads whatever the batch: per layer self-attention q, k, v, out
    (k has no bias), cross-attention q and out (its K/V projections run once per window, not per
    step), the MLP and three layer norms; the final layer norm; the token embedding read whole as
    the output projection. (Embedding rows per token are counted per row in decode_bytes_per_step.)
    """
    d = dims.n_text_state
    self_attn = 4 * d * d + 3 * d
    cross_attn = 2 * d * d + 2 * d
    mlp = 2 * 4 * d * d + 4 * d + d
    norms = 3 * 2 * d
    return dims.n_text_layer * (self_attn + cross_attn + mlp + norms) + 2 * d + dims.n_vocab * d


def decode_bytes_per_step(dims: WhisperDims, batch: int, dtype_bytes: int = 2, self_kv_len: int = 0) -> int:
    """Bytes a decode step of ``batch`` rows must read at least.

    The step's weights once (decoder_step_weights), plus per row: the cross-attention K and V of
    every layer (n_text_layer x 2 x n_audio_ctx x n_text_state), the token's embedding row and
    position row, and, if ``self_kv_len`` > 0, the self-attention K and V of that many earlier
    positions (n_text_layer x 2 x self_kv_len x n_text_state; 0 leaves them out, which keeps
    this a lower bound at any position). Writes (the new K/V entries, logits) are left out.
    """
    d = dims.n_text_state
    per_row = dims.n_text_layer * 2 * (dims.n_audio_ctx + self_kv_len) * d + 2 * d
    return dtype_bytes * (decoder_step_weights(dims) + batch * per_row)


def bandwidth_floor_ms(
    dims: WhisperDims, batch: int, dtype_bytes: int, copy_gbs: float, self_kv_len: int = 0
) -> float:
    """The least time of one decode step, in ms: decode_bytes_per_step / copy_gbs.

    Convention: ``copy_gbs`` is copy_bandwidth_gbs's figure, which counts a copy's reads and
    writes together, i.e. the memory system's total traffic rate. A decode step's traffic is
    (almost) all reads, so its floor is its bytes read divided by that same total rate: one byte
    read costs what one byte of a copy's traffic costs. (Counting a copy's reads alone would
    halve the rate and double this floor.)
    """
    return decode_bytes_per_step(dims, batch, dtype_bytes, self_kv_len) / (copy_gbs * 1e9) * 1e3


# -- results ----------------------------------------------------------------------------------
Row = Union[Mapping[str, object], Sequence[object]]


def _row_fields(row: Row) -> Tuple[str, str, int, float]:
    if isinstance(row, Mapping):
        return str(row["model"]), str(row["impl"]), int(row["batch"]), float(row["ms_per_step"])
    model, impl, batch, ms = row[:4]
    return str(model), str(impl), int(batch), float(ms)


def plot_ms_per_step(rows: Iterable[Row], path, title: Optional[str] = None) -> Path:
    """PNG of ms/step against batch size: one line per (model size, implementation), log-scale y.

    ``rows``: mappings with keys model, impl, batch, ms_per_step, or (model, impl, batch,
    ms_per_step) tuples. Colour follows the implementation, line style and marker the model size.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
    for row in rows:
        model, impl, batch, ms = _row_fields(row)
        series.setdefault((model, impl), []).append((batch, ms))
    models = list(dict.fromkeys(m for m, _ in series))
    impls = list(dict.fromkeys(i for _, i in series))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D", "v"]
    fig, ax = plt.subplots(figsize=(9, 5))
    batches = set()
    for (model, impl), points in series.items():
        points.sort()
        batches.update(b for b, _ in points)
        mi, ii = models.index(model), impls.index(impl)
        ax.plot([b for b, _ in points], [ms for _, ms in points], label=f"{model} / {impl}",
                color=colours[ii % len(colours)], linestyle=styles[mi % len(styles)],
                marker=markers[mi % len(markers)])
    ax.set_yscale("log")
    if batches and max(batches) / min(batches) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches))
    ax.set_xticklabels([str(b) for b in sorted(batches)])
    ax.set_xlabel("batch size (windows decoded together)")
    ax.set_ylabel("decode time per step (ms, median; log scale)")
    ax.set_title(title or "Whisper decode step, float16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: lines stay visible
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def e2e_clips(folder, count: int = 64) -> List[np.ndarray]:
    """``count`` 16-kHz mono clips from ``folder``'s *.npy files (sorted by name, cycled).

    float32 samples in [-1, 1]; int16 files (as dev/export_device_bundle.py writes them) are
    scaled by 1/32768.
    """
    files = sorted(Path(folder).glob("*.npy"))
    if not files:
        raise FileNotFoundError(f"no *.npy clips in {folder}")
    clips = []
    for f in files:
        a = np.load(f)
        if a.ndim != 1:
            a = a.reshape(-1)
        if a.dtype == np.int16:
            a = a.astype(np.float32) / 32768.0
        clips.append(np.ascontiguousarray(a, dtype=np.float32))
    return [clips[i % len(clips)] for i in range(count)]


# -- CPU self-check ---------------------------------------------------------------------------
SMOKE_DIMS = WhisperDims(80, 1500, 128, 2, 2, 51865, 448, 128, 2, 2)


def _smoke() -> None:
    """Same weights in ostinato, openai-whisper and transformers (float32, CPU): equal encoder
    outputs and logits, equal greedy tokens at the forced length, and the timing functions run."""
    torch.manual_seed(0)
    whisper = import_whisper()
    from ostinato import WhisperModel
    from ostinato.models.whisper.decoding import WindowRequest

    # std 0.2 rather than the benchmark's 0.02: at 0.02 the tiny random model repeats one token in
    # every row, which would not show a wrong KV cache or a wrong row order.
    dims, state = random_whisper_checkpoint(SMOKE_DIMS, seed=0, dtype=torch.float32, std=0.2)
    ids = special_ids(dims)
    batch, steps = 3, 12
    mel = random_mel(dims, batch, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        pt = save_openai_checkpoint(dims, state, Path(tmp) / "random.pt")
        ow = whisper.load_model(str(pt), device="cpu").eval()  # openai-whisper's own loader
        ost = WhisperModel(str(pt), device="cpu", compute_type="float32")
    hf = build_hf_model(dims, state, "cpu", torch.float32)
    ow2 = build_openai_model(dims, state, "cpu", torch.float32)
    for k, v in ow.state_dict().items():
        assert torch.equal(v, ow2.state_dict()[k]), k

    # openai-whisper's own non-speech set matches ostinato's (the suppress list both peers get).
    from whisper.tokenizer import get_tokenizer

    otok = get_tokenizer(dims.is_multilingual, num_languages=dims.num_languages, language="en", task="transcribe")
    assert tuple(otok.sot_sequence_including_notimestamps) == ids.prompt, (otok.sot_sequence_including_notimestamps, ids.prompt)
    assert set(otok.non_speech_tokens) <= set(ids.suppress) and otok.eot in ids.suppress

    # Encoder outputs and logits of a few tokens.
    f_ow = openai_encode(ow, mel)
    f_hf = hf_encode(hf, mel)
    f_ost = ost.encode(mel)
    tokens = torch.tensor([list(ids.prompt) + [220, 1000, 2000]] * batch)
    with torch.inference_mode():
        l_ow = ow.logits(tokens, f_ow)
        l_hf = hf(encoder_outputs=(f_ow,), decoder_input_ids=tokens).logits.float()
        l_hf_full = hf(input_features=mel, decoder_input_ids=tokens).logits.float()
        full, _ = ost.model.decoder.forward_with_cross_scores(
            tokens, *map(list, zip(*ost.model.decoder.cross_kv(f_ow))), heads=[(0, 0)])
    def err(a, b):
        return float((a - b).abs().max() / b.abs().max())
    print(f"encoder max rel. error vs openai-whisper: HF {err(f_hf, f_ow):.1e}, ostinato {err(f_ost, f_ow):.1e}")
    print(f"logits max rel. error vs openai-whisper:  HF {err(l_hf, l_ow):.1e} (with HF's encoder "
          f"{err(l_hf_full, l_ow):.1e}), ostinato {err(full, l_ow):.1e}  (logit scale {float(l_ow.abs().max()):.2f})")
    for e in (err(f_hf, f_ow), err(f_ost, f_ow), err(l_hf, l_ow), err(l_hf_full, l_ow), err(full, l_ow)):
        assert e < 1e-4, e

    # Greedy tokens at the forced length, from the same encoder output.
    t_ow = openai_decode(ow, dims, f_ow, steps)
    t_hf = hf_generate(hf, dims, f_ow, steps)
    req = WindowRequest(prompt=list(ids.prompt), timestamps=False, max_initial_timestamp_index=50, max_new_tokens=steps)
    # One window per call: the check is about the tokens, not about ostinato's batching.
    t_ost = [ost.decode(f_ow[i : i + 1], [req], list(ids.suppress), [])[0].tokens for i in range(batch)]
    for name, t in (("openai-whisper", t_ow), ("transformers", t_hf), ("ostinato", t_ost)):
        print(f"{name + ' tokens:':<23}", t)
    assert all(len(r) == steps for r in t_ow + t_hf + t_ost), [len(r) for r in t_ow + t_hf + t_ost]
    assert t_ow == t_hf == t_ost, "greedy tokens differ"
    assert len({tuple(r) for r in t_ow}) == batch and min(len(set(r)) for r in t_ow) > 2, "too little variety to check"
    assert not any(ids.eot in r for r in t_ow)
    print(f"greedy tokens equal across the three, {steps} per row, batch {batch}")

    # The timing functions run end to end (CPU, tiny numbers).
    for name, fn in (("transformers", hf_ms_per_step), ("openai-whisper", openai_ms_per_step)):
        total = fn(dims, state, batch=2, steps=6, repeats=2, device="cpu", dtype=torch.float32)
        diff = fn(dims, state, batch=2, steps=8, repeats=2, device="cpu", dtype=torch.float32, method="difference")
        print(f"{name}: {total:.2f} ms/step (total), {diff:.2f} ms/step (difference) [CPU, smoke dims]")
    gbs = copy_bandwidth_gbs("cpu", nbytes=64 << 20, repeats=3)
    tf = matmul_tflops("cpu", torch.float32, n=512, repeats=3)
    print(f"CPU copy {gbs:.1f} GB/s (read+write), matmul {tf:.3f} TFLOP/s")
    for name, d in DIMS.items():
        for b in (1, 16):
            print(f"{name:>9} batch {b:>2}: {decode_bytes_per_step(d, b, 2) / 1e9:.3f} GB/step, floor "
                  f"{bandwidth_floor_ms(d, b, 2, 3000.0):.3f} ms at 3000 GB/s")
        print(f"{name:>9} encoder: {encoder_flops(d) / 1e12:.3f} TFLOP per window")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib not installed here: plot not tried")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            p = plot_ms_per_step([("tiny", "ostinato", 1, 0.5), ("tiny", "ostinato", 16, 0.7),
                                  {"model": "tiny", "impl": "HF", "batch": 1, "ms_per_step": 9.0},
                                  {"model": "tiny", "impl": "HF", "batch": 16, "ms_per_step": 11.0}],
                                 Path(tmp) / "p.png")
            print(f"plot written ({p.stat().st_size} bytes)")
    print("smoke OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short CPU check of the peers (float32)")
    args = parser.parse_args()
    if args.smoke:
        _smoke()
    else:
        parser.print_help()
