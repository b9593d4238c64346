"""Triton kernels for the transducer's half-precision CUDA path (float16 / bfloat16).

* ``glu_dwconv_silu``: the conformer convolution module's middle in one pass: GLU over the
  pointwise output, zero past each length, depthwise convolution (batch norm folded) plus bias, swish.
* ``joint_logits``, ``decode_tail``, ``lstm_layer``: a label-looping decode step in five launches
  (joint with the encoder-frame gather fused in; argmax and all bookkeeping; one fused matrix product
  plus cell update per LSTM layer; the prediction projection through cuBLAS).

Each is used only where ``kernels_can_run(t, t.dtype, interpreter=True)`` says so (CUDA tensor, half
dtype, Triton importable);
everything else (the CPU, float32) runs the plain PyTorch code, which is the reference.
``TRITON_INTERPRET=1`` runs these kernels on the CPU for tests.
"""
from __future__ import annotations


import torch

from ...ops.triton_support import HAVE_TRITON, tl, triton  # noqa: F401


if HAVE_TRITON:

    @triton.jit
    def _sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0

    # -- encoder --------------------------------------------------------------------------------
    @triton.jit(do_not_specialize=["T"])
    def _glu_dwconv_silu_kernel(x_ptr, w_ptr, b_ptr, len_ptr, out_ptr, T,
                                C: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        length = tl.load(len_ptr + b)
        ts = pid_t * BT + tl.arange(0, BT)
        cs = pid_c * BC + tl.arange(0, BC)
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        row0 = b.to(tl.int64) * T
        for k in tl.static_range(K):
            src = ts + (k - (K - 1) // 2)
            ok = (src >= 0) & (src < length)
            ptr = x_ptr + (row0 + src)[:, None] * (2 * C) + cs[None, :]
            a = tl.load(ptr, mask=ok[:, None], other=0.0).to(tl.float32)
            g = tl.load(ptr + C, mask=ok[:, None], other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cs * K + k).to(tl.float32)
            acc += (a * _sigmoid(g)) * w[None, :]
        acc += tl.load(b_ptr + cs).to(tl.float32)[None, :]
        y = acc * _sigmoid(acc)
        tl.store(out_ptr + (row0 + ts)[:, None] * C + cs[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=(ts < T)[:, None])

    @triton.jit(do_not_specialize=["T", "T2", "sxb", "sxt", "sxf"])
    def _subsample_first_kernel(x_ptr, sxb, sxt, sxf, len_ptr, w0_ptr, b0_ptr, wd_ptr, bd_ptr, out_ptr, T, T2,
                                F: tl.constexpr, F2: tl.constexpr, C: tl.constexpr, BP: tl.constexpr,
                                BC: tl.constexpr):
        """Subsampling's first two convolutions in one pass, the big first output never written:
        conv0 (1 -> C channels, 3x3, stride 2) + relu, then the depthwise 3x3 stride-2 convolution,
        each masked past its length as NeMo masks them. x [B, T, F] (any strides, zero past each
        length), out [B, T2, F2, C] channels last. Each output position recomputes the 9 conv0
        values it reads (9 products each): cheap next to storing C x T/2 x F/2 values per row."""
        pid_p = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        n0 = tl.load(len_ptr + b)
        n1 = (n0 - 1) // 2 + 1
        n2 = (n1 - 1) // 2 + 1
        F1: tl.constexpr = (F - 1) // 2 + 1
        pos = pid_p * BP + tl.arange(0, BP)
        t2 = pos // F2
        f2 = pos % F2
        cs = pid_c * BC + tl.arange(0, BC)
        xrow = x_ptr + b.to(tl.int64) * sxb
        b0 = tl.load(b0_ptr + cs).to(tl.float32)
        acc = tl.zeros((BP, BC), dtype=tl.float32)
        for dt in tl.static_range(3):
            t1 = 2 * t2 + dt - 1
            for df in tl.static_range(3):
                f1 = 2 * f2 + df - 1
                y = tl.zeros((BP, BC), dtype=tl.float32) + b0[None, :]
                for a in tl.static_range(3):
                    t0 = 2 * t1 + a - 1
                    for e in tl.static_range(3):
                        f0 = 2 * f1 + e - 1
                        ok = (t0 >= 0) & (t0 < n0) & (f0 >= 0) & (f0 < F)
                        xin = tl.load(xrow + t0.to(tl.int64) * sxt + f0 * sxf, mask=ok, other=0.0)
                        xin = xin.to(out_ptr.dtype.element_ty).to(tl.float32)
                        w = tl.load(w0_ptr + cs * 9 + a * 3 + e).to(tl.float32)
                        y += xin[:, None] * w[None, :]
                # conv0's output in the storage dtype, relu, zero past its length and at the padding
                y = tl.maximum(y.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)
                valid = (t1 >= 0) & (t1 < n1) & (f1 >= 0) & (f1 < F1)
                y = tl.where(valid[:, None], y, 0.0)
                acc += y * tl.load(wd_ptr + cs * 9 + dt * 3 + df).to(tl.float32)[None, :]
        acc += tl.load(bd_ptr + cs).to(tl.float32)[None, :]
        acc = tl.where((t2 < n2)[:, None], acc, 0.0)
        tl.store(out_ptr + ((b.to(tl.int64) * T2 + t2) * F2 + f2)[:, None] * C + cs[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=(t2 < T2)[:, None])

    @triton.jit(do_not_specialize=["Tin", "Tout"])
    def _subsample_dw_kernel(x_ptr, len_ptr, w_ptr, b_ptr, out_ptr, Tin, Tout, FIN: tl.constexpr,
                             FOUT: tl.constexpr, C: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr):
        """Depthwise 3x3 stride-2 convolution, channels last: x [B, Tin, FIN, C] is a pointwise
        convolution's output, read through relu and zero past the row's length (which is how NeMo
        leaves it); out [B, Tout, FOUT, C] is zero past the output length."""
        pid_p = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        n_in = tl.load(len_ptr + b)
        n_out = (n_in - 1) // 2 + 1
        pos = pid_p * BP + tl.arange(0, BP)
        t = pos // FOUT
        f = pos % FOUT
        cs = pid_c * BC + tl.arange(0, BC)
        acc = tl.zeros((BP, BC), dtype=tl.float32)
        for dt in tl.static_range(3):
            ti = 2 * t + dt - 1
            for df in tl.static_range(3):
                fi = 2 * f + df - 1
                ok = (ti >= 0) & (ti < n_in) & (fi >= 0) & (fi < FIN)
                v = tl.load(x_ptr + ((b.to(tl.int64) * Tin + ti) * FIN + fi)[:, None] * C + cs[None, :],
                            mask=ok[:, None], other=0.0)
                v = tl.maximum(v.to(tl.float32), 0.0)
                acc += v * tl.load(w_ptr + cs * 9 + dt * 3 + df).to(tl.float32)[None, :]
        acc += tl.load(b_ptr + cs).to(tl.float32)[None, :]
        acc = tl.where((t < n_out)[:, None], acc, 0.0)
        tl.store(out_ptr + ((b.to(tl.int64) * Tout + t) * FOUT + f)[:, None] * C + cs[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=(t < Tout)[:, None])

    @triton.jit(do_not_specialize=["T", "q_stride_b", "q_stride_t", "out_stride_bh", "out_stride_t"])
    def _relpos_bias_kernel(q_ptr, p_ptr, bu_ptr, bv_ptr, kb_ptr, qu_ptr, out_ptr, T, q_stride_b, q_stride_t, out_stride_bh,
                            out_stride_t, scale, HAS_KB: tl.constexpr, H: tl.constexpr, DK: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr):
        """bias[b, h, i, j] = ((q_i + v) . p[i - j + T - 1]) * scale (+ key padding bias[b, j]).

        One tile's positions are BM + BN - 1 consecutive rows of p: one product on the tensor cores,
        then the skewed diagonal band is gathered out of it."""
        pid_j = tl.program_id(0)
        pid_i = tl.program_id(1)
        bh = tl.program_id(2)
        b = bh // H
        h = bh % H
        i = pid_i * BM + tl.arange(0, BM)
        j = pid_j * BN + tl.arange(0, BN)
        ks = tl.arange(0, DK)
        q = tl.load(q_ptr + b.to(tl.int64) * q_stride_b + i[:, None] * q_stride_t + h * DK + ks[None, :],
                    mask=(i < T)[:, None], other=0.0)
        bv = tl.load(bv_ptr + h * DK + ks)
        qv = ((q + bv[None, :]).to(tl.float32) * scale).to(q.dtype)
        if pid_j == 0:  # the content query q + u, [B, T, H, DK] contiguous, as a side output
            bu = tl.load(bu_ptr + h * DK + ks)
            tl.store(qu_ptr + ((b.to(tl.int64) * T + i[:, None]) * H + h) * DK + ks[None, :], q + bu[None, :],
                     mask=(i < T)[:, None])
        s0 = pid_i * BM - pid_j * BN - BN + T
        r = s0 + tl.arange(0, BM + BN)
        pt = tl.load(p_ptr + r[:, None] * (H * DK) + h * DK + ks[None, :],
                     mask=((r >= 0) & (r < 2 * T - 1))[:, None], other=0.0)
        full = tl.dot(qv, tl.trans(pt))  # [BM, BM + BN]
        # (storing each product straight to its skewed place instead measured 3.4x slower on the H100)
        idx = tl.arange(0, BM)[:, None] - tl.arange(0, BN)[None, :] + (BN - 1)
        out = tl.gather(full, idx, axis=1)
        if HAS_KB:
            out += tl.load(kb_ptr + b * T + j, mask=j < T, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + bh.to(tl.int64) * out_stride_bh + i[:, None] * out_stride_t + j[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(i < T)[:, None] & (j < T)[None, :])

    # -- decode ---------------------------------------------------------------------------------
    @triton.jit
    def _joint_logits_kernel(enc_ptr, t_ptr, last_ptr, g_ptr, w_ptr, bias_ptr, out_ptr, rows, frames, n_out,
                             J: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """logits[m] = W relu(enc_proj[m, min(t, last)] + g_proj[m]) + b, float32."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        ms = pid_m * BM + tl.arange(0, BM)
        ns = pid_n * BN + tl.arange(0, BN)
        mok = ms < rows
        nok = ns < n_out
        t = tl.load(t_ptr + ms, mask=mok, other=0)
        last = tl.load(last_ptr + ms, mask=mok, other=0)
        frame = tl.minimum(t, last)
        enc_row = (ms.to(tl.int64) * frames + frame) * J
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, J, BK):
            ks = k0 + tl.arange(0, BK)
            f = tl.load(enc_ptr + enc_row[:, None] + ks[None, :], mask=mok[:, None], other=0.0)
            g = tl.load(g_ptr + ms[:, None] * J + ks[None, :], mask=mok[:, None], other=0.0)
            a = tl.maximum((f + g).to(tl.float32), 0.0).to(w_ptr.dtype.element_ty)
            w = tl.load(w_ptr + ns[:, None] * J + ks[None, :], mask=nok[:, None], other=0.0)
            acc += tl.dot(a, tl.trans(w))
        acc += tl.load(bias_ptr + ns, mask=nok, other=0.0).to(tl.float32)[None, :]
        acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)  # rounded like the PyTorch step's logits
        tl.store(out_ptr + ms[:, None] * n_out + ns[None, :], acc, mask=mok[:, None] & nok[None, :])

    @triton.jit
    def _decode_tail_kernel(logits_ptr, n_out, n_labels, durations_ptr, t_ptr, length_ptr, active_ptr,
                            n_tokens_ptr, last_frame_ptr, count_ptr, max_symbols_ptr,
                            out_labels_ptr, out_frames_ptr, out_durations_ptr, out_stride, capacity,
                            label_ptr, emit_ptr, blank_id,
                            IS_TDT: tl.constexpr, N_DUR: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr):
        """Argmax label (and duration), then NeMo's bookkeeping for one row, as in ``step``."""
        m = tl.program_id(0)
        vs = tl.arange(0, BV)
        x = tl.load(logits_ptr + m * n_out + vs, mask=vs < n_labels, other=float("-inf"))
        best = tl.max(x, axis=0)
        label = tl.min(tl.where(x == best, vs, BV), axis=0)  # first maximum
        blank = label == blank_id
        if IS_TDT:
            ds = tl.arange(0, BD)
            xd = tl.load(logits_ptr + m * n_out + n_labels + ds, mask=ds < N_DUR, other=float("-inf"))
            bestd = tl.max(xd, axis=0)
            di = tl.min(tl.where(xd == bestd, ds, BD), axis=0)
            duration = tl.load(durations_ptr + di)
            duration = tl.where(blank & (duration == 0), 1, duration)
        else:
            duration = tl.where(blank, 1, 0).to(tl.int64)
        t = tl.load(t_ptr + m)
        length = tl.load(length_ptr + m)
        active = tl.load(active_ptr + m) != 0
        emit = active & (label != blank_id)
        cursor = tl.load(n_tokens_ptr + m)
        column = tl.where(emit, cursor, capacity)
        tl.store(out_labels_ptr + m * out_stride + column, label.to(tl.int32))
        tl.store(out_frames_ptr + m * out_stride + column, t.to(tl.int32))
        if IS_TDT:
            tl.store(out_durations_ptr + m * out_stride + column, duration.to(tl.int32))
        tl.store(n_tokens_ptr + m, cursor + emit.to(tl.int64))
        last_frame = tl.load(last_frame_ptr + m)
        count = tl.load(count_ptr + m)
        count = tl.where(emit, tl.where(last_frame == t, count + 1, 1), count)
        last_frame = tl.where(emit, t, last_frame)
        tl.store(count_ptr + m, count)
        tl.store(last_frame_ptr + m, last_frame)
        new_t = tl.where(active, t + duration, t)
        max_symbols = tl.load(max_symbols_ptr)
        force = emit & (new_t < length) & (count >= max_symbols) & (last_frame == new_t)
        new_t = new_t + force.to(tl.int64)
        tl.store(t_ptr + m, new_t)
        tl.store(active_ptr + m, (new_t < length).to(tl.int1))
        tl.store(label_ptr + m, label.to(tl.int64))
        tl.store(emit_ptr + m, emit.to(tl.int32))

    @triton.jit
    def _lstm_layer_kernel(x_ptr, table_ptr, label_ptr, h_in_ptr, h_out_ptr, c_ptr, w_ptr, bias_ptr, emit_ptr, rows,
                           H: tl.constexpr, USE_TABLE: tl.constexpr,
                           BM: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr):
        """One LSTM layer for rows that emitted a label: gates = W [x; h] + b (layer 0: the x part is a
        row of the precomputed embedding table), then the cell. Other rows copy h through unchanged.
        W is [4H, 2H] (gate order i, f, g, o); a program takes BJ units, i.e. 4*BJ rows of W stacked
        gate-major into one tile. h_out must not alias h_in (other programs read h_in)."""
        pid_m = tl.program_id(0)
        pid_j = tl.program_id(1)
        ms = pid_m * BM + tl.arange(0, BM)
        mok = ms < rows
        n = tl.arange(0, 4 * BJ)
        wrows = (n // BJ) * H + pid_j * BJ + (n % BJ)
        acc = tl.zeros((BM, 4 * BJ), dtype=tl.float32)
        if not USE_TABLE:
            for k0 in range(0, H, BK):
                ks = k0 + tl.arange(0, BK)
                a = tl.load(x_ptr + ms[:, None] * H + ks[None, :], mask=mok[:, None], other=0.0)
                w = tl.load(w_ptr + wrows[:, None] * (2 * H) + ks[None, :])
                acc += tl.dot(a, tl.trans(w))
        for k0 in range(0, H, BK):
            ks = k0 + tl.arange(0, BK)
            a = tl.load(h_in_ptr + ms[:, None] * H + ks[None, :], mask=mok[:, None], other=0.0)
            w = tl.load(w_ptr + wrows[:, None] * (2 * H) + H + ks[None, :])
            acc += tl.dot(a, tl.trans(w))
        if USE_TABLE:
            label = tl.load(label_ptr + ms, mask=mok, other=0)
            acc += tl.load(table_ptr + label[:, None] * (4 * H) + wrows[None, :], mask=mok[:, None], other=0.0)
        acc += tl.load(bias_ptr + wrows).to(tl.float32)[None, :]
        js = pid_j * BJ + tl.arange(0, BJ)
        offs = ms[:, None] * H + js[None, :]
        c_old = tl.load(c_ptr + offs, mask=mok[:, None], other=0.0)
        h_old = tl.load(h_in_ptr + offs, mask=mok[:, None], other=0.0)
        dt = c_old.dtype
        acc = acc.to(dt).to(tl.float32)  # gates rounded like the PyTorch step's product
        # [BM, 4*BJ] (column = gate * BJ + unit, gate = 2x + y) -> four [BM, BJ] gates
        g4 = tl.permute(tl.reshape(acc, (BM, 2, 2, BJ)), (0, 3, 1, 2))
        y0, y1 = tl.split(g4)
        gi, gg = tl.split(y0)
        gf, go = tl.split(y1)
        # every intermediate rounded to the storage dtype, as the PyTorch step computes it
        keep = (_sigmoid(gf).to(dt).to(tl.float32) * c_old.to(tl.float32)).to(dt).to(tl.float32)
        write = (_sigmoid(gi).to(dt).to(tl.float32) * _tanh(gg).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        c_new = (keep + write).to(dt).to(tl.float32)
        h_new = _sigmoid(go).to(dt).to(tl.float32) * _tanh(c_new).to(dt).to(tl.float32)
        emit = (tl.load(emit_ptr + ms, mask=mok, other=0) != 0)[:, None]
        tl.store(c_ptr + offs, tl.where(emit, c_new.to(dt), c_old), mask=mok[:, None])
        tl.store(h_out_ptr + offs, tl.where(emit, h_new.to(dt), h_old), mask=mok[:, None])


# launch configurations (dev/transducer_kernels_bench.py times alternatives on the device)
CONFIG = {
    "glu_dwconv": dict(BT=32, BC=64, num_warps=4),
    # (a cuBLAS product over all 2T-1 positions per head plus a shift pass measured 2x slower on the H100)
    "relpos": dict(BM=64, BN=64, num_warps=4, num_stages=1),
    "subsample": dict(BP=32, BC=64, num_warps=4),
    "joint": dict(BN=16, num_warps=4, BK=128),  # up to 16 rows
    "joint_wide": dict(BN=32, num_warps=4, BK=128),  # more rows
    "lstm": dict(BJ=8, num_warps=4, BK=128),
    "lstm_wide": dict(BJ=8, num_warps=4, BK=128),
}


def glu_dwconv_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x [B, T, 2C] (pointwise-conv output) -> swish(depthwise_conv(glu(x) zeroed past lengths) + bias) [B, T, C]."""
    b, t, c2 = x.shape
    c = c2 // 2
    k = weight.shape[-1]
    x = x.contiguous()
    out = torch.empty(b, t, c, device=x.device, dtype=x.dtype)
    cfg = CONFIG["glu_dwconv"]
    bt, bc = cfg["BT"], cfg["BC"]
    while c % bc:
        bc //= 2
    grid = (triton.cdiv(t, bt), triton.cdiv(c, bc), b)
    _glu_dwconv_silu_kernel[grid](x, weight.contiguous(), bias, lengths.contiguous(), out, t, C=c, K=k, BT=bt, BC=bc,
                                  num_warps=cfg["num_warps"])
    return out


def subsample_first(x: torch.Tensor, lengths: torch.Tensor, conv0, depthwise, dtype) -> torch.Tensor:
    """x [B, T, F] (any float dtype and strides, zero past lengths) -> [B, T/4, F/4, C] channels last in
    ``dtype``: conv0 + relu + depthwise conv, masked as DwStridingSubsampling masks them."""
    b, t, f = x.shape
    c = conv0.out_channels
    t2 = ((t - 1) // 2) // 2 + 1
    f2 = ((f - 1) // 2) // 2 + 1
    out = torch.empty(b, t2, f2, c, device=x.device, dtype=dtype)
    cfg = CONFIG["subsample"]
    bp, bc = cfg["BP"], min(cfg["BC"], c)
    grid = (triton.cdiv(t2 * f2, bp), triton.cdiv(c, bc), b)
    _subsample_first_kernel[grid](x, x.stride(0), x.stride(1), x.stride(2), lengths, conv0.weight, conv0.bias,
                                  depthwise.weight, depthwise.bias, out, t, t2, F=f, F2=f2, C=c, BP=bp, BC=bc,
                                  num_warps=cfg["num_warps"])
    return out


def subsample_depthwise(x: torch.Tensor, lengths: torch.Tensor, depthwise) -> torch.Tensor:
    """x [B, T, F, C] channels last (a pointwise conv's output, relu and masking still to apply)
    -> the depthwise 3x3 stride-2 convolution [B, T/2, F/2, C], zero past the output lengths."""
    b, t, f, c = x.shape
    t_out, f_out = (t - 1) // 2 + 1, (f - 1) // 2 + 1
    out = torch.empty(b, t_out, f_out, c, device=x.device, dtype=x.dtype)
    cfg = CONFIG["subsample"]
    bp, bc = cfg["BP"], min(cfg["BC"], c)
    grid = (triton.cdiv(t_out * f_out, bp), triton.cdiv(c, bc), b)
    _subsample_dw_kernel[grid](x, lengths, depthwise.weight, depthwise.bias, out, t, t_out, FIN=f, FOUT=f_out, C=c,
                               BP=bp, BC=bc, num_warps=cfg["num_warps"])
    return out


def relpos_bias(q: torch.Tensor, p: torch.Tensor, pos_bias_u: torch.Tensor, pos_bias_v: torch.Tensor, key_bias,
                scale: float):
    """q [B, T, H, DK] (rows may be strided), p [2T-1, H*DK] (ascending positions), key_bias [B, T] or
    None -> (q + u as [B, T, H, DK], the additive attention bias [B, H, T, T], a view of a buffer
    whose rows are 16-aligned)."""
    b, t, h, dk = q.shape
    assert q.stride(3) == 1 and q.stride(2) == dk and p.is_contiguous()
    pad = -(-t // 16) * 16
    out = torch.empty(b, h, t, pad, device=q.device, dtype=q.dtype)
    q_u = torch.empty(b, t, h, dk, device=q.device, dtype=q.dtype)
    cfg = CONFIG["relpos"]
    bm, bn = cfg["BM"], cfg["BN"]
    grid = (triton.cdiv(t, bn), triton.cdiv(t, bm), b * h)
    kb = key_bias if key_bias is not None else out
    _relpos_bias_kernel[grid](q, p, pos_bias_u, pos_bias_v, kb, q_u, out, t, q.stride(0), q.stride(1), t * pad, pad,
                              scale, HAS_KB=key_bias is not None, H=h, DK=dk, BM=bm, BN=bn,
                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return q_u, out[..., :t]


def joint_logits(enc_proj, t, last_t, g_proj, weight, bias, out) -> None:
    rows, j = g_proj.shape
    n_out = weight.shape[0]
    cfg = CONFIG["joint" if rows <= 16 else "joint_wide"]
    bm, bn = 16, cfg["BN"]
    bk = next(b for b in (cfg["BK"], 64, 32, 16) if j % b == 0)
    grid = (triton.cdiv(rows, bm), triton.cdiv(n_out, bn))
    _joint_logits_kernel[grid](enc_proj, t, last_t, g_proj, weight, bias, out, rows, enc_proj.shape[1], n_out,
                               J=j, BM=bm, BN=bn, BK=bk, num_warps=cfg["num_warps"])


def decode_tail(logits, n_labels, durations, t, length, active, n_tokens, last_frame, count, max_symbols,
                out_labels, out_frames, out_durations, capacity, label, emit, blank_id, is_tdt) -> None:
    rows, n_out = logits.shape
    n_dur = n_out - n_labels
    _decode_tail_kernel[(rows,)](
        logits, n_out, n_labels, durations, t, length, active, n_tokens, last_frame, count, max_symbols,
        out_labels, out_frames, out_durations if out_durations is not None else out_frames, out_labels.stride(0),
        capacity, label, emit, blank_id,
        IS_TDT=is_tdt, N_DUR=max(n_dur, 1), BV=triton.next_power_of_2(n_labels), BD=max(2, triton.next_power_of_2(max(n_dur, 1))),
    )


def lstm_layer(x, table, label, h_in, h_out, c, weight, bias, emit) -> None:
    rows, hidden = h_in.shape
    cfg = CONFIG["lstm" if rows <= 16 else "lstm_wide"]
    bm, bj = 16, cfg["BJ"]
    while hidden % bj:
        bj //= 2
    bj = max(bj, 4)
    bk = next(b for b in (cfg["BK"], 64, 32, 16) if hidden % b == 0)
    use_table = table is not None
    grid = (triton.cdiv(rows, bm), triton.cdiv(hidden, bj))
    _lstm_layer_kernel[grid](x if x is not None else h_in, table if use_table else h_in, label, h_in, h_out, c,
                             weight, bias, emit, rows, H=hidden, USE_TABLE=use_table, BM=bm, BJ=bj, BK=bk,
                             num_warps=cfg["num_warps"])
