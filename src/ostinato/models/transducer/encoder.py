"""The FastConformer encoder (NeMo's ``ConformerEncoder`` at inference), batch norm folded.

Depthwise-striding subsampling (8x, masked between convolutions as NeMo 3 does, so a row's result
does not depend on the padding of its batch), relative-position multi-head attention
(Transformer-XL style, ``pos_bias_u``/``pos_bias_v``), the macaron feed-forward pair and the
convolution module whose batch norm is folded into the depthwise convolution.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .nemo_checkpoint import EncoderConfig

_MASK_VALUE = -10000.0  # NeMo's INF_VAL


def subsampled_length(lengths: Tensor, factor: int) -> Tensor:
    """Output length of ``log2(factor)`` stride-2, kernel-3, padding-1 convolutions."""
    for _ in range(int(math.log2(factor))):
        lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
    return lengths


class DwStridingSubsampling(nn.Module):
    def __init__(self, feat_in: int, d_model: int, channels: int, factor: int):
        super().__init__()
        n = int(math.log2(factor))
        self.conv0 = nn.Conv2d(1, channels, 3, stride=2, padding=1)
        self.depthwise = nn.ModuleList(nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels) for _ in range(n - 1))
        self.pointwise = nn.ModuleList(nn.Conv2d(channels, channels, 1) for _ in range(n - 1))
        freq = feat_in
        for _ in range(n):
            freq = (freq - 1) // 2 + 1
        self.out = nn.Linear(channels * freq, d_model)

    # the first convolution's output is channels x T/2 x feat/2 per row: big batches of long inputs
    # run through the convolutions a few rows at a time (rows are independent, results unchanged)
    max_conv_bytes = 1 << 30

    @staticmethod
    def _mask(x: Tensor, lengths: Tensor) -> Tensor:
        keep = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
        return x.mul_(keep[:, None, :, None].to(x.dtype))

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        """x [B, T, feat] -> [B, T', d_model]; masked after every layer like NeMo's MaskedConvSequential."""
        b, t, f = x.shape
        per_row = self.conv0.out_channels * ((t + 1) // 2) * ((f + 1) // 2) * x.element_size()
        rows = max(1, self.max_conv_bytes // max(1, per_row))
        if b > rows:
            outs = [self._forward(x[i:i + rows], lengths[i:i + rows]) for i in range(0, b, rows)]
            return torch.cat([o for o, _ in outs]), torch.cat([n for _, n in outs])
        return self._forward(x, lengths)

    def _forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        x = self._mask(x[:, None].clone(), lengths)
        lengths = subsampled_length(lengths, 2)
        x = self._mask(self.conv0(x), lengths).relu_()
        for dw, pw in zip(self.depthwise, self.pointwise):
            lengths = subsampled_length(lengths, 2)
            x = self._mask(dw(x), lengths)
            x = self._mask(pw(x), lengths).relu_()
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths


def relative_positions(length: int, d_model: int, device, dtype) -> Tensor:
    """NeMo's RelPositionalEncoding for positions length-1 .. -(length-1): [1, 2*length-1, d_model]."""
    positions = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(positions.shape[0], d_model, device=device)
    pe[:, 0::2] = torch.sin(positions * div_term)
    pe[:, 1::2] = torch.cos(positions * div_term)
    return pe.unsqueeze(0).to(dtype)


class RelPositionAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, bias: bool):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
        self.linear_k = nn.Linear(d_model, d_model, bias=bias)
        self.linear_v = nn.Linear(d_model, d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.d_k))

    def forward(self, x: Tensor, pos_emb: Tensor, att_mask: Tensor) -> Tensor:
        """x [B, T, d]; pos_emb [1, 2T-1, d]; att_mask [B, 1, T, T] True where attention is not allowed."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(1, -1, self.h, self.d_k).transpose(1, 2)  # [1, h, 2T-1, d_k]
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        bd = torch.matmul(q_v, p.transpose(-2, -1)).contiguous()  # [B, h, T, 2T-1]
        # Transformer-XL relative shift without the padded copy: out[i, j] = bd[i, T-1-i+j]
        w = bd.shape[-1]
        bd = bd.as_strided((b, self.h, t, t), (self.h * t * w, t * w, w - 1, 1), bd.storage_offset() + t - 1)
        scale = 1.0 / math.sqrt(self.d_k)
        bias = (bd * scale).masked_fill(att_mask, _MASK_VALUE)
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias)
        # rows that may attend nowhere (padding frames) are zero, as in NeMo
        out = out.masked_fill(att_mask.all(dim=-1, keepdim=True), 0.0)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class ConvModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv (batch norm folded in), swish, pointwise conv."""

    def __init__(self, d_model: int, kernel_size: int, bias: bool):
        super().__init__()
        self.pointwise1 = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel_size, padding=(kernel_size - 1) // 2, groups=d_model, bias=True)
        self.pointwise2 = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, pad_mask: Tensor) -> Tensor:
        x = F.glu(self.pointwise1(x), dim=-1)
        x = x.masked_fill(pad_mask[:, :, None], 0.0)
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return self.pointwise2(F.silu(x))


class ConformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d, bias = cfg.d_model, cfg.use_bias
        self.norm_ff1 = nn.LayerNorm(d)
        self.ff1 = FeedForward(d, cfg.d_ff, bias)
        self.norm_att = nn.LayerNorm(d)
        self.attn = RelPositionAttention(d, cfg.n_heads, bias)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = ConvModule(d, cfg.conv_kernel_size, bias)
        self.norm_ff2 = nn.LayerNorm(d)
        self.ff2 = FeedForward(d, cfg.d_ff, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x: Tensor, pos_emb: Tensor, att_mask: Tensor, pad_mask: Tensor) -> Tensor:
        x = x + 0.5 * self.ff1(self.norm_ff1(x))
        x = x + self.attn(self.norm_att(x), pos_emb, att_mask)
        x = x + self.conv(self.norm_conv(x), pad_mask)
        x = x + 0.5 * self.ff2(self.norm_ff2(x))
        return self.norm_out(x)


class FastConformerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = DwStridingSubsampling(cfg.feat_in, cfg.d_model, cfg.subsampling_conv_channels, cfg.subsampling_factor)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))
        self.xscale = math.sqrt(cfg.d_model) if cfg.xscaling else None

    def output_lengths(self, feature_lengths: Tensor) -> Tensor:
        return subsampled_length(feature_lengths, self.cfg.subsampling_factor)

    def forward(self, features: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        """features [B, feat, T] -> encoder output [B, T', d_model] (time-major, unlike NeMo), lengths [B]."""
        dtype = self.pre_encode.out.weight.dtype
        x, lengths = self.pre_encode(features.transpose(1, 2).to(dtype), lengths)
        if self.xscale is not None:
            x = x * self.xscale
        t = x.shape[1]
        pos_emb = relative_positions(t, self.cfg.d_model, x.device, x.dtype)
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
        pad_mask = ~valid
        att_mask = ~(valid[:, None, :] & valid[:, :, None])  # [B, T, T]
        att_mask = att_mask[:, None]
        for layer in self.layers:
            x = layer(x, pos_emb, att_mask, pad_mask)
        return x, lengths


def encoder_state_from_nemo(sd: Dict[str, Tensor], cfg: EncoderConfig) -> Dict[str, Tensor]:
    """Map NeMo's ``encoder.*`` weights onto FastConformerEncoder, folding each batch norm."""
    out: Dict[str, Tensor] = {}
    p = "encoder.pre_encode."
    out["pre_encode.conv0.weight"] = sd[p + "conv.0.weight"]
    out["pre_encode.conv0.bias"] = sd[p + "conv.0.bias"]
    for i in range(int(math.log2(cfg.subsampling_factor)) - 1):
        out[f"pre_encode.depthwise.{i}.weight"] = sd[f"{p}conv.{2 + 3 * i}.weight"]
        out[f"pre_encode.depthwise.{i}.bias"] = sd[f"{p}conv.{2 + 3 * i}.bias"]
        out[f"pre_encode.pointwise.{i}.weight"] = sd[f"{p}conv.{3 + 3 * i}.weight"]
        out[f"pre_encode.pointwise.{i}.bias"] = sd[f"{p}conv.{3 + 3 * i}.bias"]
    out["pre_encode.out.weight"] = sd[p + "out.weight"]
    out["pre_encode.out.bias"] = sd[p + "out.bias"]
    names = {
        "norm_feed_forward1": "norm_ff1", "norm_self_att": "norm_att", "norm_conv": "norm_conv",
        "norm_feed_forward2": "norm_ff2", "norm_out": "norm_out",
    }
    for i in range(cfg.n_layers):
        src, dst = f"encoder.layers.{i}.", f"layers.{i}."
        for a, b in names.items():
            out[dst + b + ".weight"] = sd[src + a + ".weight"]
            out[dst + b + ".bias"] = sd[src + a + ".bias"]
        for ff, name in (("feed_forward1", "ff1"), ("feed_forward2", "ff2")):
            for lin in ("linear1", "linear2"):
                out[f"{dst}{name}.{lin}.weight"] = sd[f"{src}{ff}.{lin}.weight"]
                if cfg.use_bias:
                    out[f"{dst}{name}.{lin}.bias"] = sd[f"{src}{ff}.{lin}.bias"]
        for lin in ("linear_q", "linear_k", "linear_v", "linear_out"):
            out[f"{dst}attn.{lin}.weight"] = sd[f"{src}self_attn.{lin}.weight"]
            if cfg.use_bias:
                out[f"{dst}attn.{lin}.bias"] = sd[f"{src}self_attn.{lin}.bias"]
        out[f"{dst}attn.linear_pos.weight"] = sd[f"{src}self_attn.linear_pos.weight"]
        for bias in ("pos_bias_u", "pos_bias_v"):
            key = f"{src}self_attn.{bias}" if cfg.untie_biases else f"encoder.{bias}"
            if key not in sd and f"encoder.{bias}" in sd:
                key = f"encoder.{bias}"
            out[f"{dst}attn.{bias}"] = sd[key]
        c = src + "conv."
        out[f"{dst}conv.pointwise1.weight"] = sd[c + "pointwise_conv1.weight"].squeeze(-1)
        out[f"{dst}conv.pointwise2.weight"] = sd[c + "pointwise_conv2.weight"].squeeze(-1)
        if cfg.use_bias:
            out[f"{dst}conv.pointwise1.bias"] = sd[c + "pointwise_conv1.bias"]
            out[f"{dst}conv.pointwise2.bias"] = sd[c + "pointwise_conv2.bias"]
        # fold batch norm (eval statistics) into the depthwise convolution, in float64
        w = sd[c + "depthwise_conv.weight"].double()
        b = sd[c + "depthwise_conv.bias"].double() if cfg.use_bias else torch.zeros(w.shape[0], dtype=torch.float64)
        gamma = sd[c + "batch_norm.weight"].double()
        beta = sd[c + "batch_norm.bias"].double()
        mean = sd[c + "batch_norm.running_mean"].double()
        var = sd[c + "batch_norm.running_var"].double()
        scale = gamma / torch.sqrt(var + 1e-5)
        out[f"{dst}conv.depthwise.weight"] = (w * scale[:, None, None]).float()
        out[f"{dst}conv.depthwise.bias"] = ((b - mean) * scale + beta).float()
    return out
