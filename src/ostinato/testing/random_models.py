"""Random-weight models in the real shapes, for tests, dev scripts and benchmarks: one place, so the
same seed gives the same weights wherever a model is built.

Whisper: ``random_whisper_checkpoint`` (a state dict in OpenAI's layout, drawn straight in the
target dtype), ``random_whisper`` (the module, PyTorch's default init), ``random_mel``,
``whisper_tokenizer`` and ``forced_requests`` (requests that run a fixed number of steps).
Transducers: ``parakeet_tdt_v2_config`` (Parakeet-TDT-0.6B-v2's shape), ``fake_tokenizer``,
``random_transducer_network`` with ``install_pattern`` (a fixed blank/label pattern the joint reads
off reserved encoder channels, so random weights decode like a trained model would: some labels,
mostly blanks), and ``random_prediction_and_joint`` (a small prediction network and joint).
"""
from __future__ import annotations

import math
from typing import Dict, Tuple, Union

import numpy as np
import torch

from ..models.transducer.decoder import Joint, PredictionNetwork
from ..models.transducer.model import TransducerNetwork
from ..models.transducer.nemo_checkpoint import EncoderConfig, PreprocessorConfig, TransducerConfig
from ..models.transducer.tokenizer import NORMAL, UNKNOWN, SentencePieceDecoder
from ..models.whisper.config import OFFICIAL_DIMS, WhisperDims
from ..models.whisper.decoding import WindowRequest
from ..models.whisper.loaders.checkpoint import expected_shapes
from ..models.whisper.loaders.vocab import vocabulary_layout, whisper_tokenizer_file
from ..models.whisper.modules import Whisper, sinusoids
from ..models.whisper.tokenizer import WhisperTokenizer

StateDict = Dict[str, torch.Tensor]
_LAYER_NORMS = {"attn_ln", "cross_attn_ln", "mlp_ln", "ln", "ln_post"}


# -- Whisper ----------------------------------------------------------------------------------
def random_whisper_checkpoint(
    size: Union[str, WhisperDims], seed: int = 0, dtype: torch.dtype = torch.float16, device="cpu",
    std: float = 0.02,
) -> Tuple[WhisperDims, StateDict]:
    """Random weights in OpenAI's layout: (dims, state_dict), every tensor ``dtype`` on ``device``.

    ``size`` is a name of DIMS/OFFICIAL_DIMS or a WhisperDims. Linear, conv and embedding weights
    and all biases are N(0, std) (std 0.02 by default); LayerNorm weights 1 + N(0, 0.1) and biases N(0, 0.02) (not
    exactly 1 and 0, so that a swapped layer-norm mapping shows in the logits); the encoder's
    position table is Whisper's fixed sinusoids. Values are drawn straight in ``dtype`` from one
    seeded generator: large-v3 (1.55 G parameters) takes seconds on CPU, less with device="cuda".
    """
    dims = size if isinstance(size, WhisperDims) else OFFICIAL_DIMS[size]
    generator = torch.Generator(device=device).manual_seed(seed)
    state: StateDict = {}
    for name, shape in expected_shapes(dims).items():
        if name == "encoder.positional_embedding":
            state[name] = sinusoids(*shape).to(device=device, dtype=dtype)
            continue
        t = torch.empty(shape, dtype=dtype, device=device)
        module, kind = name.split(".")[-2:]
        if module in _LAYER_NORMS and kind == "weight":
            t.normal_(1.0, 0.1, generator=generator)
        else:
            t.normal_(0.0, std, generator=generator)
        state[name] = t
    return dims, state


def save_random_whisper_checkpoint(size: Union[str, WhisperDims], path, dtype: torch.dtype = torch.float16) -> str:
    """``random_whisper_checkpoint(size, dtype=dtype)`` saved at ``path`` as an OpenAI .pt, which
    ``WhisperModel`` loads like any checkpoint (benchmarks and probes of full-size shapes); returns
    the path as a string."""
    dims, state = random_whisper_checkpoint(size, dtype=dtype)
    torch.save({"dims": dims.to_dict(), "model_state_dict": state}, path)
    return str(path)


def random_mel(dims: WhisperDims, batch: int, seed: int = 0) -> torch.Tensor:
    """[batch, n_mels, 2 * n_audio_ctx] float32 on CPU, in the range of Whisper's log-mel input."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(batch, dims.n_mels, 2 * dims.n_audio_ctx, generator=g)).clamp_(-1.5, 1.5)


def random_whisper(size: str, device, dtype) -> Whisper:
    dims = OFFICIAL_DIMS[size]
    torch.manual_seed(0)
    with torch.device(device):
        model = Whisper(dims)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("positional_embedding") and "decoder" in name:
                p.normal_(0, 0.01)
            elif p.dim() == 1 and "ln" in name and name.endswith("weight"):
                p.fill_(1.0)
    return model.to(dtype).eval().requires_grad_(False)


def whisper_tokenizer(n_vocab: int) -> WhisperTokenizer:
    multilingual, languages = vocabulary_layout(n_vocab)
    return WhisperTokenizer(whisper_tokenizer_file(n_vocab), multilingual, languages)


def forced_requests(tok: WhisperTokenizer, batch: int, steps: int):
    sot = tok.sot_sequence("en", "transcribe")  # [sot] alone for an English-only model
    request = WindowRequest(prompt=list(sot), timestamps=True, max_initial_timestamp_index=50, max_new_tokens=steps)
    return [request] * batch, list(tok.suppressed_tokens([-1])) + [tok.eot]


# -- transducers -----------------------------------------------------------------------------
DURATIONS = [0, 1, 2, 3, 4]


def parakeet_tdt_v2_config() -> TransducerConfig:
    return TransducerConfig(
        preprocessor=PreprocessorConfig(features=128, pad_to=0),
        encoder=EncoderConfig(feat_in=128, n_layers=24, d_model=1024, n_heads=8, ff_expansion_factor=4,
                              subsampling_factor=8, subsampling_conv_channels=256, conv_kernel_size=9),
        vocab_size=1024, pred_hidden=640, pred_layers=2, joint_hidden=640, durations=DURATIONS, max_symbols=10,
    )


def fake_tokenizer(n: int) -> SentencePieceDecoder:
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [("<unk>", UNKNOWN)] + [(("\u2581" if i % 3 == 0 else "") + letters[i % 26] + letters[(i // 26) % 26], NORMAL)
                                     for i in range(1, n)]
    return SentencePieceDecoder(pieces)


# reserved encoder channels / joint hidden units that carry the forced pattern
BLANK_UNIT, LABEL_UNIT, DUR_UNIT0 = 0, 1, 2


def random_transducer_network(cfg: TransducerConfig, device, dtype, seed: int = 0) -> TransducerNetwork:
    torch.manual_seed(seed)
    with torch.device(device):
        net = TransducerNetwork(cfg)
    with torch.no_grad():
        h = cfg.pred_hidden
        for w in net.prednet.weights:
            w.normal_(0, 1 / math.sqrt(h))
        net.prednet.embed.weight.normal_(0, 0.5)
        net.prednet.embed.weight[cfg.blank_id].zero_()
        joint = net.joint
        v1 = cfg.vocab_size + 1
        k = DUR_UNIT0 + len(DURATIONS)
        # the pattern units read only their encoder channel; nothing else writes to them
        joint.enc.weight[:k].zero_()
        joint.enc.bias[:k].zero_()
        joint.pred.weight[:k].zero_()
        joint.pred.bias[:k].zero_()
        for u in range(k):
            joint.enc.weight[u, u] = 1.0
        joint.out.weight[:, :k].zero_()
        big = 50.0
        joint.out.weight[cfg.blank_id, BLANK_UNIT] = big  # blank frames
        joint.out.weight[: cfg.vocab_size, LABEL_UNIT] = big  # label frames: every label lifted alike
        for j in range(len(DURATIONS)):
            joint.out.weight[v1 + j, DUR_UNIT0 + j] = big
    return net.to(dtype)


def pattern(frames: int, seed: int) -> torch.Tensor:
    """[frames, channels] values for the reserved channels: blank or label, and the duration."""
    rng = np.random.default_rng(seed)
    k = DUR_UNIT0 + len(DURATIONS)
    p = np.zeros((frames, k), dtype=np.float32)
    label = rng.random(frames) < 0.3
    p[label, LABEL_UNIT] = 1.0
    p[~label, BLANK_UNIT] = 1.0
    dur = np.where(label, rng.integers(1, 4, frames), rng.integers(1, 5, frames))
    p[np.arange(frames), DUR_UNIT0 + dur] = 1.0
    return torch.from_numpy(p)


def install_pattern(net: TransducerNetwork, seed: int = 1) -> None:
    table = pattern(100_000, seed)
    on_device = {}  # (device, dtype) -> the table there: a copy per call from pageable memory would make
    # the host wait for the device after every encoder call (and the GPU idle while it catches up)

    def hook(module, inputs, output):
        x, lengths = output
        k = table.shape[1]
        key = (x.device, x.dtype)
        if key not in on_device:
            on_device[key] = table.to(x.device, x.dtype)
        x = x.clone()
        x[:, :, :k] = on_device[key][: x.shape[1]][None]
        return x, lengths

    net.encoder.register_forward_hook(hook)


def random_prediction_and_joint(vocab, hidden, joint_hidden, durations, dtype, seed=0, blank_boost=0.3):
    torch.manual_seed(seed)
    p = PredictionNetwork(vocab, hidden, 2)
    for w in p.weights:
        w.data.normal_(0, 1 / math.sqrt(hidden))
    for b in p.biases:
        b.data.normal_(0, 0.1)
    p.embed.weight.data.normal_(0, 1)
    j = Joint(48, hidden, joint_hidden, vocab + 1 + len(durations), "relu")
    j.out.weight.data.mul_(3.0)
    with torch.no_grad():
        j.out.bias[vocab] += blank_boost
    return p.to(dtype).eval(), j.to(dtype).eval()
