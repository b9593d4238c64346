"""The FastConformer encoder (NeMo's ``ConformerEncoder`` at inference), batch norm folded.

Depthwise-striding subsampling (8x, masked between convolutions as NeMo 3 does, so a row's result
does not depend on the padding of its batch), relative-position multi-head attention
(Transformer-XL style, ``pos_bias_u``/``pos_bias_v``), the macaron feed-forward pair and the
convolution module whose batch norm is folded into the depthwise convolution.

The padded layers below are the reference (the CPU, float32). On CUDA in half precision every layer
runs on the rows' valid frames packed one after another (``PackedRows``, the ``forward_packed``
methods): no padding reaches the linears, norms and activations, and the attention and the
convolution keep to each row's own frames.
"""
from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ops import skinny
from ...ops.fused_linear import fused_linear_supported, linear_glu, linear_silu
from ...ops.triton_support import kernels_can_run
from . import kernels
from .nemo_checkpoint import EncoderConfig

_MASK_VALUE = -10000.0  # NeMo's INF_VAL


def subsampled_length(lengths, factor: int):
    """Output length of ``log2(factor)`` stride-2, kernel-3, padding-1 convolutions (a tensor of
    lengths, or one length as an int)."""
    for _ in range(int(math.log2(factor))):
        lengths = (lengths - 1) // 2 + 1  # floor division, for tensors and ints alike
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
    def _mask(x: Tensor, lengths) -> Tensor:
        """Zero each row's frames past its length (``lengths`` on the host): only the padding is written."""
        t = x.shape[2]
        for i, n in enumerate(lengths):
            if n < t:
                x[i, :, n:].zero_()
        return x

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        """x [B, T, feat] (any float dtype) -> [B, T', d_model]; masked after every layer like NeMo's
        MaskedConvSequential."""
        dtype = self.out.weight.dtype
        out_lengths = subsampled_length(lengths, 2 ** (1 + len(self.depthwise)))
        if kernels_can_run(x, dtype, interpreter=True) and self.depthwise:
            return self._forward_kernels(x, lengths.to(x.device)), out_lengths
        self._out_weight_channels_last(False)
        x = x.to(dtype)
        b, t, f = x.shape
        per_row = self.conv0.out_channels * ((t + 1) // 2) * ((f + 1) // 2) * x.element_size()
        rows = max(1, self.max_conv_bytes // max(1, per_row))
        host = [int(n) for n in lengths.tolist()]
        if b > rows:
            outs = [self._forward(x[i:i + rows], host[i:i + rows]) for i in range(0, b, rows)]
            out = torch.cat(outs)
        else:
            out = self._forward(x, host)
        return out, out_lengths

    def _out_weight_channels_last(self, channels_last: bool) -> None:
        """Reorder the output layer's input columns in place: (channel, frequency) as NeMo flattens
        NCHW, or (frequency, channel) for the kernels' channels-last layout. One copy of the weight
        either way; it changes only if a model switches paths."""
        if getattr(self, "_channels_last", False) == channels_last:
            return
        w = self.out.weight
        d, c = w.shape[0], self.conv0.out_channels
        f = w.shape[1] // c
        order = w.detach().view(d, c, f) if channels_last else w.detach().view(d, f, c)
        with torch.no_grad():
            w.copy_(order.transpose(1, 2).reshape(d, c * f).clone())
        self._channels_last = channels_last

    def forward_packed(self, x: Tensor, lengths: Tensor, rows: "PackedRows") -> Tensor:
        """x [B, T, feat] -> the valid frames packed [F, d_model] (``rows``: see ``pack_rows``): on the
        kernel path the output layer runs on them alone."""
        if kernels_can_run(x, self.out.weight.dtype, interpreter=True) and self.depthwise:
            return self._forward_kernels(x, lengths.to(x.device), rows.source)
        out, _ = self.forward(x, lengths)
        return out.view(-1, out.shape[-1]).index_select(0, rows.source)

    def _forward_kernels(self, x: Tensor, lengths: Tensor, source: Optional[Tensor] = None) -> Tensor:
        """CUDA half precision: conv0 and the first depthwise conv fused, then channels last throughout
        (pointwise convs as plain products, relu and masks folded into the next kernel's loads). With
        ``source`` (packed frames' places) the valid frames are taken before the output layer."""
        dtype = self.out.weight.dtype
        self._out_weight_channels_last(True)
        b, t, f = x.shape
        x = torch.empty(b, t, f, device=x.device, dtype=dtype).copy_(x)
        y = kernels.subsample_first(x, lengths, self.conv0, self.depthwise[0], dtype)
        n = subsampled_length(lengths, 4)
        for k, pw in enumerate(self.pointwise):
            if k:
                y = kernels.subsample_depthwise(y, n, self.depthwise[k])
                n = subsampled_length(n, 2)
            c = y.shape[-1]
            y = torch.addmm(pw.bias, y.view(-1, c), pw.weight.view(c, c).t()).view(y.shape)
        if source is not None:
            return self.out(y.view(b * y.shape[1], -1).index_select(0, source).relu_())
        valid = torch.arange(y.shape[1], device=y.device)[None, :] < n[:, None]
        y = y.relu_().masked_fill_(~valid[:, :, None, None], 0.0)
        return self.out(y.view(b, y.shape[1], -1))

    def _forward(self, x: Tensor, lengths) -> Tensor:
        x = self._mask(x[:, None].clone(), lengths)
        lengths = [(n - 1) // 2 + 1 for n in lengths]
        x = self._mask(self.conv0(x), lengths).relu_()
        for dw, pw in zip(self.depthwise, self.pointwise):
            lengths = [(n - 1) // 2 + 1 for n in lengths]
            x = self._mask(dw(x), lengths)
            x = self._mask(pw(x), lengths).relu_()
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f))


def relative_positions(length: int, d_model: int, device, dtype) -> Tensor:
    """NeMo's RelPositionalEncoding for positions -(length-1) .. length-1 (ascending; NeMo lists them
    descending): [2*length-1, d_model]."""
    positions = torch.arange(-(length - 1), length, dtype=torch.float32, device=device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(positions.shape[0], d_model, device=device)
    pe[:, 0::2] = torch.sin(positions * div_term)
    pe[:, 1::2] = torch.cos(positions * div_term)
    return pe.to(dtype)


class RelPositionAttention(nn.Module):
    """Transformer-XL relative-position attention through ``scaled_dot_product_attention``.

    score[i, j] = ((q_i + u) . k_j + (q_i + v) . p(i - j)) / sqrt(d_k). With the keys taken in reverse
    time order (j' = T-1-j) the position term of query i is a product with the *contiguous* window
    p[i : i+T] of the ascending position projections, so each head's term is one batched matrix product
    over strided windows (no [T, 2T-1] intermediate, no shift copy), written straight into the additive
    bias that SDPA reads. Key padding is added to that bias; padded query rows give finite values that
    no valid frame ever reads. This is the reference; ``forward_packed`` is the CUDA half-precision path.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.linear_qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.d_k))

    def forward(self, x: Tensor, pos_emb: Tensor, key_bias: Optional[Tensor]) -> Tensor:
        """x [B, T, d]; pos_emb [2T-1, d] (ascending positions); key_bias [B, T] (0 or -10000) or None
        when no row is padded."""
        b, t, d = x.shape
        h, dk = self.h, self.d_k
        scale = 1.0 / math.sqrt(dk)
        qkv = self.linear_qkv(x)
        q = qkv[..., :d].view(b, t, h, dk)
        p = self.linear_pos(pos_emb).contiguous()  # [2T-1, d]
        if key_bias is not None:
            key_bias = key_bias.flip(1)
        kv = torch.flip(qkv[..., d:], dims=(1,))  # keys and values in reverse time order
        k = kv[..., :d].view(b, t, h, dk).transpose(1, 2)
        v = kv[..., d:].view(b, t, h, dk).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        # (q + v) / sqrt(d_k), laid out [h, T, B, d_k] for the per-head products below
        q_v = torch.empty(h, t, b, dk, device=x.device, dtype=x.dtype)
        torch.add(self.pos_bias_v[:, None, None, :] * scale, q.permute(2, 1, 0, 3), alpha=scale, out=q_v)
        pad = -(-t // 16) * 16  # rows of the bias 16-element aligned: SDPA uses it without a copy
        bias = windowed_position_term(q_v, p, torch.empty(h, t, b, pad, device=x.device, dtype=x.dtype))
        bias = bias[..., :t]
        if key_bias is not None:
            bias.add_(key_bias)
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias.permute(2, 0, 1, 3))
        return self.linear_out(out.transpose(1, 2).reshape(b, t, d))

    def forward_packed(self, x: Tensor, pos_emb: Tensor, rows: "PackedRows") -> Tensor:
        """The kernel path: x [F, d] packed frames, pos_emb [W + 8, d] (descending, padded: see
        ``kernels.position_term``) -> [F, d]. The position term is one batched cuBLAS product of every
        frame against every relative position (the windowed products above, batched over time,
        measured 2.7x slower on the H100: cuBLAS runs them as many skinny products); a flash-style
        kernel over each row's own frames reads it along the skewed diagonal (no padded keys, no mask,
        no [B, H, T, T] bias through SDPA)."""
        scale = 1.0 / math.sqrt(self.d_k)
        qkv = self.linear_qkv(x)
        pos = kernels.position_term(qkv, self.pos_bias_v, self.linear_pos(pos_emb), rows.longest, scale)
        out = kernels.relpos_attention(qkv, self.pos_bias_u, pos, rows.starts, rows.lengths, rows.longest, scale)
        return self.linear_out(out)


def windowed_position_term(q_v: Tensor, p: Tensor, out: Tensor) -> Tensor:
    """The relative-position term with the keys in reverse time order: q_v [H, T, B, d_k] is (q + v) /
    sqrt(d_k) time major, p [2T-1, H * d_k] the ascending position projections; out [H, T, B, T' >= T]
    gets out[h, i, b, j'] = q_v[h, i, b] . p[i + j', h] = the term of query i and key T-1-j'. With the
    keys reversed, query i's positions are the contiguous window p[i : i+T], so each head is one
    batched product over strided windows: exactly the band that is needed, no [T, 2T-1] intermediate
    and no shift copy."""
    h, t, _, dk = q_v.shape
    d = p.shape[1]
    off = p.storage_offset()
    for head in range(h):
        window = p.as_strided((t, dk, t), (d, 1, d), off + head * dk)  # [i, :, j'] = p[i + j', head]
        torch.bmm(q_v[head], window, out=out[head, :, :, :t])
    return out


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.silu(self.linear1(x), inplace=True))

    def forward_packed(self, x: Tensor) -> Tensor:
        """x [F, d]: the first linear's bias and swish in its product's epilogue where the GPU allows."""
        if self.linear1.bias is None:
            return self.forward(x)
        return self.linear2(linear_silu(x, self.linear1.weight, self.linear1.bias))


class ConvModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv (batch norm folded in), swish, pointwise conv."""

    def __init__(self, d_model: int, kernel_size: int, bias: bool):
        super().__init__()
        self.pointwise1 = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel_size, padding=(kernel_size - 1) // 2, groups=d_model, bias=True)
        self.pointwise2 = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, pad_mask: Optional[Tensor]) -> Tensor:
        x = F.glu(self.pointwise1(x), dim=-1)
        if pad_mask is not None:
            x = x.masked_fill(pad_mask[:, :, None], 0.0)
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return self.pointwise2(F.silu(x))

    def forward_packed(self, x: Tensor, rows: "PackedRows") -> Tensor:
        """x [F, d] packed frames: the GLU in the first pointwise product's epilogue where the GPU allows
        (else in the next kernel), then the row bounds, the depthwise conv and swish in one kernel."""
        conv = self.depthwise
        if self.pointwise1.bias is not None and fused_linear_supported(x, self.pointwise1.weight):
            x = linear_glu(x, self.pointwise1.weight, self.pointwise1.bias)
            x = kernels.glu_dwconv_silu(x, conv.weight, conv.bias, rows.starts, rows.lengths, rows.longest, glu=False)
        else:
            x = kernels.glu_dwconv_silu(self.pointwise1(x), conv.weight, conv.bias, rows.starts, rows.lengths,
                                        rows.longest)
        return self.pointwise2(x)


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

    def forward(self, x: Tensor, pos_emb: Tensor, key_bias: Optional[Tensor], pad_mask: Optional[Tensor]) -> Tensor:
        """x is the layer's own residual stream (updated in place)."""
        x = x.add_(self.ff1(self.norm_ff1(x)), alpha=0.5)
        x = x.add_(self.attn(self.norm_att(x), pos_emb, key_bias))
        x = x.add_(self.conv(self.norm_conv(x), pad_mask))
        x = x.add_(self.ff2(self.norm_ff2(x)), alpha=0.5)
        return self.norm_out(x)

    def forward_packed(self, x: Tensor, h: Tensor, pos_emb: Tensor, rows: "PackedRows",
                       next_norm: Optional[nn.LayerNorm]) -> Tuple[Tensor, Optional[Tensor]]:
        """The kernel path on packed frames [F, d], h = norm_ff1(x) given: each residual add and the next
        LayerNorm in one pass (one read of the stream less), the last one followed by the next layer's
        first norm (``next_norm``) -> (the layer's output, next_norm of it or None)."""
        for block, alpha, norm in ((self.ff1.forward_packed, 0.5, self.norm_att),
                                   (lambda h: self.attn.forward_packed(h, pos_emb, rows), 1.0, self.norm_conv),
                                   (lambda h: self.conv.forward_packed(h, rows), 1.0, self.norm_ff2)):
            x, h = skinny.add_layer_norm(x, block(h), norm.weight, norm.bias, norm.eps, out_residual=x, alpha=alpha)
        # the last add's sum is only normed (the norm is the layer's output): it is not stored
        norm = self.norm_out
        if next_norm is None:
            return skinny.add_layer_norm(x, self.ff2.forward_packed(h), norm.weight, norm.bias, norm.eps,
                                         alpha=0.5, store_residual=False)[1], None
        _, out, h = skinny.add_layer_norm(x, self.ff2.forward_packed(h), norm.weight, norm.bias, norm.eps,
                                          alpha=0.5, then=(next_norm.weight, next_norm.bias, next_norm.eps),
                                          store_residual=False)
        return out, h


class PackedRows(NamedTuple):
    """A batch's valid frames one row after another, no padding between rows (the kernel path's layout):
    per-frame work (the linears, norms, activations) runs on real frames only."""
    starts: Tensor  # [B] each row's first frame
    lengths: Tensor  # [B] its frames
    frames: int  # all rows' frames
    longest: int  # the padded length T
    source: Tensor  # [frames] each packed frame's place in the padded [B * T] layout


def pack_rows(lengths: Tensor, frames: int, longest: int) -> PackedRows:
    """Built on the device from the lengths (no host sync); ``frames`` must be their sum."""
    b = lengths.shape[0]
    device = lengths.device
    lengths = lengths.to(torch.int64)
    starts = lengths.cumsum(0) - lengths
    row = torch.repeat_interleave(torch.arange(b, device=device), lengths, output_size=frames)
    source = row * longest + torch.arange(frames, device=device) - starts[row]
    return PackedRows(starts, lengths, frames, longest, source)


class FastConformerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = DwStridingSubsampling(cfg.feat_in, cfg.d_model, cfg.subsampling_conv_channels, cfg.subsampling_factor)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))
        self.xscale = math.sqrt(cfg.d_model) if cfg.xscaling else None

    def output_lengths(self, feature_lengths: Tensor) -> Tensor:
        return subsampled_length(feature_lengths, self.cfg.subsampling_factor)

    def forward(self, features: Tensor, lengths: Tensor, padded: Optional[bool] = None,
                host_lengths: Optional[Sequence[int]] = None) -> Tuple[Tensor, Tensor]:
        """features [B, feat, T] -> encoder output [B, T', d_model] (time-major, unlike NeMo), lengths [B].

        ``padded``: whether any row's output is shorter than T', and ``host_lengths``: the feature
        lengths, when the caller knows them (otherwise one wait for the device to find out). Frames
        past a row's length hold finite values that depend on the padding (zeros on the kernel path);
        read only valid frames.
        """
        dtype = self.pre_encode.out.weight.dtype
        if kernels_can_run(features, dtype, interpreter=True) and self.layers[0].attn.d_k in (16, 32, 64, 128):
            return self._forward_packed(features, lengths, host_lengths)
        x, lengths = self.pre_encode(features.transpose(1, 2), lengths)
        t = x.shape[1]
        pos_emb = relative_positions(t, self.cfg.d_model, x.device, x.dtype)
        if self.xscale is not None:
            x = x.mul_(self.xscale)
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
        if padded is None:
            padded = not bool((lengths >= t).all())  # one host sync: no padding, no masks
        if not padded:
            pad_mask = key_bias = None
        else:
            pad_mask = ~valid
            key_bias = torch.zeros(valid.shape, device=x.device, dtype=x.dtype).masked_fill_(pad_mask, _MASK_VALUE)
        for layer in self.layers:
            x = layer(x, pos_emb, key_bias, pad_mask)
        return x, lengths

    def _forward_packed(self, features: Tensor, lengths: Tensor,
                        host_lengths: Optional[Sequence[int]]) -> Tuple[Tensor, Tensor]:
        """The kernel path: every layer on the rows' valid frames packed one after another."""
        factor = self.cfg.subsampling_factor
        b, d = features.shape[0], self.cfg.d_model
        t = subsampled_length(features.shape[-1], factor)
        out_lengths = subsampled_length(lengths.to(features.device), factor)
        frames = (sum(subsampled_length(int(n), factor) for n in host_lengths) if host_lengths is not None
                  else int(out_lengths.sum()))  # one host sync
        rows = pack_rows(out_lengths, frames, t)
        h = self.pre_encode.forward_packed(features.transpose(1, 2), lengths, rows)
        if self.xscale is not None:
            h = h.mul_(self.xscale)
        # the positions in descending order, zero rows before them and 8 after, W + 8 rows in all (see
        # kernels.position_term; W a multiple of 8: the products' rows stay 16-byte aligned for cuBLAS,
        # unaligned they took 4x as long on the H100)
        width = -(-(2 * t + 7) // 8) * 8
        pos_emb = relative_positions(t, d, h.device, h.dtype).flip(0)
        pos_emb = F.pad(pos_emb, (0, 0, width - (2 * t - 1), 8))
        first = self.layers[0].norm_ff1
        normed = skinny.add_layer_norm(h, None, first.weight, first.bias, first.eps)[1]
        for k, layer in enumerate(self.layers):
            after = self.layers[k + 1].norm_ff1 if k + 1 < len(self.layers) else None
            h, normed = layer.forward_packed(h, normed, pos_emb, rows, after)
        return h.new_zeros(b * t, d).index_copy_(0, rows.source, h).view(b, t, d), out_lengths


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
        # q, k and v as one product
        out[f"{dst}attn.linear_qkv.weight"] = torch.cat([sd[f"{src}self_attn.linear_{n}.weight"] for n in "qkv"])
        out[f"{dst}attn.linear_out.weight"] = sd[f"{src}self_attn.linear_out.weight"]
        if cfg.use_bias:
            out[f"{dst}attn.linear_qkv.bias"] = torch.cat([sd[f"{src}self_attn.linear_{n}.bias"] for n in "qkv"])
            out[f"{dst}attn.linear_out.bias"] = sd[f"{src}self_attn.linear_out.bias"]
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
