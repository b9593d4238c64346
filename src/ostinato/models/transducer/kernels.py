"""Triton kernels for the transducer's half-precision CUDA path (float16 / bfloat16).

* ``glu_dwconv_silu``: the conformer convolution module's middle in one pass: GLU over the
  pointwise output (or the GLU taken before, by ``ops.fused_linear.linear_glu``), zero outside each
  row, depthwise convolution (batch norm folded) plus bias, swish.
* ``relpos_attention``: Transformer-XL relative-position attention, flash style, adding the position
  term that ``position_term``'s cuBLAS product wrote (every frame against every relative position),
  read along the skewed diagonal in aligned vectors.
* ``subsample_first``, ``subsample_depthwise``: the striding subsampling's convolutions, channels last.
* The encoder kernels take rows of packed frames (no padding between rows).
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
    from ...ops.triton_support import fast_sigmoid


if HAVE_TRITON:

    @triton.jit
    def _sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0

    # -- encoder --------------------------------------------------------------------------------
    @triton.jit
    def _glu_dwconv_silu_kernel(x_ptr, w_ptr, b_ptr, start_ptr, len_ptr, out_ptr,
                                C: tl.constexpr, K: tl.constexpr, GLU: tl.constexpr, BT: tl.constexpr,
                                BC: tl.constexpr):
        """Rows of packed frames (row b: frames start[b] .. start[b] + len[b]); out has x's frames. x is
        [F, 2C] (values, gates: the GLU is taken here) or, without GLU, [F, C] (already taken)."""
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2)
        length = tl.load(len_ptr + b)
        if pid_t * BT < length:
            row0 = tl.load(start_ptr + b)
            ts = pid_t * BT + tl.arange(0, BT)
            cs = pid_c * BC + tl.arange(0, BC)
            acc = tl.zeros((BT, BC), dtype=tl.float32)
            for k in tl.static_range(K):
                src = ts + (k - (K - 1) // 2)
                ok = (src >= 0) & (src < length)
                w = tl.load(w_ptr + cs * K + k).to(tl.float32)
                if GLU:
                    ptr = x_ptr + (row0 + src)[:, None] * (2 * C) + cs[None, :]
                    a = tl.load(ptr, mask=ok[:, None], other=0.0).to(tl.float32)
                    g = tl.load(ptr + C, mask=ok[:, None], other=0.0).to(tl.float32)
                    acc += (a * fast_sigmoid(g)) * w[None, :]
                else:
                    a = tl.load(x_ptr + (row0 + src)[:, None] * C + cs[None, :], mask=ok[:, None], other=0.0)
                    acc += a.to(tl.float32) * w[None, :]
            acc += tl.load(b_ptr + cs).to(tl.float32)[None, :]
            y = acc * fast_sigmoid(acc)
            tl.store(out_ptr + (row0 + ts)[:, None] * C + cs[None, :], y.to(out_ptr.dtype.element_ty),
                     mask=(ts < length)[:, None])

    @triton.jit(do_not_specialize=["T", "T2", "sxb", "sxt", "sxf"])
    def _subsample_first_kernel(x_ptr, sxb, sxt, sxf, len_ptr, w0_ptr, b0_ptr, wd_ptr, bd_ptr, out_ptr, T, T2,
                                F: tl.constexpr, F2: tl.constexpr, C: tl.constexpr, BP: tl.constexpr,
                                BC: tl.constexpr):
        """Subsampling's first two convolutions in one pass, the big first output never written:
        conv0 (1 -> C channels, 3x3, stride 2) + relu, then the depthwise 3x3 stride-2 convolution,
        each masked past its length as NeMo masks them. x [B, T, F] (any strides, zero past each
        length), out [B, T2, F2, C] channels last. Each output position recomputes the 9 conv0
        outputs it reads (cheap next to storing C x T/2 x F/2 values per row), each as one tensor-core
        product: its 3x3 input patch and a 1 for the bias [BP, 16] times the filters [16, BC]."""
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
        dt_ = out_ptr.dtype.element_ty
        # conv0's filters as a [16, BC] operand: rows 0-8 the taps (a, e) = (k // 3, k % 3), row 9 the bias
        k = tl.arange(0, 16)
        w0 = tl.load(w0_ptr + cs[None, :] * 9 + k[:, None], mask=(k < 9)[:, None], other=0.0)
        w0 = tl.where((k == 9)[:, None], tl.load(b0_ptr + cs)[None, :], w0).to(dt_)
        acc = tl.zeros((BP, BC), dtype=tl.float32)
        for dt in tl.static_range(3):
            t1 = 2 * t2 + dt - 1
            for df in tl.static_range(3):
                f1 = 2 * f2 + df - 1
                t0 = 2 * t1[:, None] + k[None, :] // 3 - 1
                f0 = 2 * f1[:, None] + k[None, :] % 3 - 1
                ok = (t0 >= 0) & (t0 < n0) & (f0 >= 0) & (f0 < F) & (k < 9)[None, :]
                patch = tl.load(xrow + t0.to(tl.int64) * sxt + f0 * sxf, mask=ok, other=0.0)
                patch = tl.where((k == 9)[None, :], 1.0, patch.to(dt_).to(tl.float32)).to(dt_)
                y = tl.dot(patch, w0)
                # conv0's output in the storage dtype, relu, zero past its length and at the padding
                y = tl.maximum(y.to(dt_).to(tl.float32), 0.0)
                valid = (t1 >= 0) & (t1 < n1) & (f1 >= 0) & (f1 < F1)
                y = tl.where(valid[:, None], y, 0.0)
                acc += y * tl.load(wd_ptr + cs * 9 + dt * 3 + df).to(tl.float32)[None, :]
        acc += tl.load(bd_ptr + cs).to(tl.float32)[None, :]
        acc = tl.where((t2 < n2)[:, None], acc, 0.0)
        tl.store(out_ptr + ((b.to(tl.int64) * T2 + t2) * F2 + f2)[:, None] * C + cs[None, :],
                 acc.to(dt_), mask=(t2 < T2)[:, None])

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

    @triton.jit(do_not_specialize=["scale", "F", "F8"])
    def _position_queries_kernel(qkv_ptr, v_ptr, out_ptr, scale, F, F8, H: tl.constexpr, DK: tl.constexpr,
                                 BT: tl.constexpr):
        """out [8, H, F8, DK]: (q + v) * scale of frame f of the packed [F, 3 * H * DK] projection at
        [7 - f % 8, h, f // 8] (frames in eight classes, see ``position_term``)."""
        pid_t = tl.program_id(0)
        h = tl.program_id(1)
        f = pid_t * BT + tl.arange(0, BT)
        ks = tl.arange(0, DK)
        ok = (f < F)[:, None]
        q = tl.load(qkv_ptr + f.to(tl.int64)[:, None] * (3 * H * DK) + h * DK + ks[None, :], mask=ok)
        q = ((q + tl.load(v_ptr + h * DK + ks)[None, :]).to(tl.float32) * scale).to(q.dtype)
        dst = ((7 - f % 8) * H + h).to(tl.int64) * F8 + f // 8
        tl.store(out_ptr + dst[:, None] * DK + ks[None, :], q, mask=ok)

    @triton.jit(do_not_specialize=["scale", "W", "c", "F8"])
    def _relpos_attention_kernel(qkv_ptr, u_ptr, pos_ptr, start_ptr, len_ptr, out_ptr, scale, W, c, F8,
                                 H: tl.constexpr, DK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """Relative-position attention of one (query block, head, row), flash style, over the row's own
        frames: out_i = softmax_j(((q_i + u) . k_j) * scale + pos_term(i, j)) v_j (the scores kept in
        base-2 units: the position term comes times log2 e).

        q, k, v: the row's frames of the packed [F, 3 * H * DK] projection. ``pos`` [8, H, F8, W] is
        ``position_term``'s product: frame f = 8m + k's term for distance i - j sits at
        [7 - k, h, m, W - 9 - c + k - i + j], so along a row of keys it is contiguous and ascending,
        and every row of a block starts at the same address modulo 8: with the key blocks placed to
        make that address a multiple of 8, a block's terms are read as aligned vectors."""
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
        n = tl.load(len_ptr + b).to(tl.int32)
        m0 = pid_m * BM
        if m0 < n:
            D: tl.constexpr = H * DK
            start = tl.load(start_ptr + b)
            i = m0 + tl.arange(0, BM)
            ks = tl.arange(0, DK)
            qok = i < n
            row = qkv_ptr + start * (3 * D) + h * DK
            q = tl.load(row + i[:, None] * (3 * D) + ks[None, :], mask=qok[:, None], other=0.0)
            q = q + tl.load(u_ptr + h * DK + ks)[None, :]
            f = start + i
            k = f % 8
            pos_rows = (((7 - k) * H + h) * F8 + f // 8) * W + W - 9 - c + k - i  # int64; + j: the key's term
            cols = tl.arange(0, BN)
            # key blocks at jt = first (mod BN): pos_rows + jt is then a multiple of 8 in every row
            # (pos_rows = start - 9 - c modulo 8 throughout the row)
            first = ((9 + c - start.to(tl.int32)) % 8 + 8) % 8 - 8
            m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
            l_i = tl.zeros((BM,), dtype=tl.float32)
            acc = tl.zeros((BM, DK), dtype=tl.float32)
            for jt in range(first, n, BN):
                j = jt + cols
                kok = (j >= 0) & (j < n)
                kv = row + j[:, None] * (3 * D) + ks[None, :]
                k_ = tl.load(kv + D, mask=kok[:, None], other=0.0)
                # no key mask on this load (it would split the vectors): masked keys read terms of
                # neighbouring frames or the buffer's margins, and score -inf below
                lowest = tl.multiple_of(pos_rows + jt, 8)
                # scores in base-2 units (the position term comes times log2 e): exp2 takes them as they are
                s = tl.dot(q, tl.trans(k_)) * (scale * 1.4426950408889634)
                s += tl.load(pos_ptr + lowest[:, None] + cols[None, :], mask=qok[:, None], other=0.0).to(tl.float32)
                if (jt < 0) | (jt + BN > n):  # only the first and last key blocks hold keys outside the row
                    s = tl.where(kok[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                # (rescaling only when a row's maximum grows by more than 2^8, as FlashAttention-3 does,
                # measured 12% slower here: the block-wide test costs more than the rescale it skips)
                alpha = tl.exp2(m_i - m_new)
                p = tl.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(kv + 2 * D, mask=kok[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            out = acc / l_i[:, None]
            tl.store(out_ptr + (start + i)[:, None] * D + h * DK + ks[None, :], out.to(out_ptr.dtype.element_ty),
                     mask=qok[:, None])

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


# launch configurations, the fastest measured on an H100 (dev/transducer_kernels_bench.py times
# alternatives on the device)
CONFIG = {
    "glu_dwconv": dict(BT=16, BC=128, num_warps=4),
    "dwconv": dict(BT=32, BC=64, num_warps=4),
    "relpos": dict(BM=128, BN=64, num_warps=8, num_stages=3),
    "subsample_first": dict(BP=64, BC=128, num_warps=4),
    "subsample": dict(BP=32, BC=64, num_warps=4),
    "joint": dict(BN=16, num_warps=4, BK=128),  # up to 16 rows
    "joint_wide": dict(BN=32, num_warps=4, BK=128),  # more rows
    "lstm": dict(BJ=8, num_warps=4, BK=128),
    "lstm_wide": dict(BJ=8, num_warps=4, BK=128),
}


def glu_dwconv_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, starts: torch.Tensor,
                    lengths: torch.Tensor, longest: int, glu: bool = True) -> torch.Tensor:
    """x [F, 2C]: the pointwise conv's output for rows of packed frames (row b: ``lengths[b]`` frames from
    ``starts[b]``; ``longest`` the most) -> swish(depthwise_conv(glu(x), zero outside the row) + bias) [F, C].
    With ``glu=False`` x is [F, C], the GLU already taken."""
    f, cx = x.shape
    c = cx // 2 if glu else cx
    k = weight.shape[-1]
    x = x.contiguous()
    out = torch.empty(f, c, device=x.device, dtype=x.dtype)
    cfg = CONFIG["glu_dwconv" if glu else "dwconv"]
    bt, bc = cfg["BT"], cfg["BC"]
    while c % bc:
        bc //= 2
    grid = (triton.cdiv(longest, bt), triton.cdiv(c, bc), lengths.shape[0])
    _glu_dwconv_silu_kernel[grid](x, weight.contiguous(), bias, starts, lengths, out, C=c, K=k, GLU=glu, BT=bt, BC=bc,
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
    cfg = CONFIG["subsample_first"]
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


def position_term(qkv: torch.Tensor, pos_bias_v: torch.Tensor, pr: torch.Tensor, longest: int, scale: float):
    """The position term of every frame against every relative position, for ``relpos_attention``,
    times log2 e (the attention's scores are in base-2 units).

    qkv [F, 3 * H * DK] packed frames; pr [W + 8, H * DK] the position projections in descending order,
    padded: zero rows, then distances T-1 .. -(T-1) (T = ``longest``), then 8 zero rows (W a multiple
    of 8, >= 2T + 7). Frames go in eight classes by f % 8; class k's product uses the positions
    shifted by 8 - k rows:
    out[7 - k, h, m, s] = ((q + v) * scale)[8m + k, h] . pr[s + 8 - k, h]. Frame f's term against key j
    is then at s = W - 9 - c + k - i + j (i its position in its row, c = T - 1): ascending in j, and
    at the same address modulo 8 in every frame of a row (the attention kernel reads it as aligned
    vectors; unaligned, it measured 1.9x slower). One cuBLAS product, write-bound (Triton kernels
    computing only the tiles inside each frame's band of needed distances measured 1.3x slower, and
    with TMA stores 11% faster alone but no faster inside the encoder, on the H100). Returns the
    [8, H, F8, W] view of a buffer with margins before and after it, which the kernel may read for
    masked keys."""
    h, dk = pos_bias_v.shape
    f = qkv.shape[0]
    f8 = -(-f // 8)
    w = pr.shape[0] - 8
    q_v = torch.empty(8, h, f8, dk, device=qkv.device, dtype=qkv.dtype)
    bt = 32
    _position_queries_kernel[(triton.cdiv(f, bt), h)](qkv, pos_bias_v, q_v, scale * 1.4426950408889634, f, f8, H=h,
                                                      DK=dk, BT=bt, num_warps=4)
    # the kernel's reads for masked keys land at most a key block past the buffer's last row and 8 terms
    # before its first: the margins cover that with room to spare
    margin = -(-(longest + 2 * CONFIG["relpos"]["BN"] + 16) // 8) * 8
    flat = torch.empty(2 * margin + 8 * h * f8 * w, device=qkv.device, dtype=qkv.dtype)
    out = flat[margin:margin + 8 * h * f8 * w].view(8, h, f8, w)
    # one batched product over (slot, head): slot 7 - k (class k) reads pr from row 8 - k = slot + 1, at
    # element (slot + 1) * H * DK + h * DK = (H + slot * H + h) * DK: the 8 * H operands DK elements apart
    positions = pr.as_strided((8 * h, dk, w), (dk, 1, h * dk), pr.storage_offset() + h * dk)
    torch.bmm(q_v.view(8 * h, f8, dk), positions, out=out.view(8 * h, f8, w))
    return out


def relpos_attention(qkv: torch.Tensor, pos_bias_u: torch.Tensor, pos: torch.Tensor, starts: torch.Tensor,
                     lengths: torch.Tensor, longest: int, scale: float) -> torch.Tensor:
    """Relative-position attention over rows of packed frames: qkv [F, 3 * H * DK], pos the
    ``position_term`` of the same frames (T = ``longest``) -> [F, H * DK]."""
    h, dk = pos_bias_u.shape
    f8, w = pos.shape[2], pos.shape[3]
    out = torch.empty(qkv.shape[0], h * dk, device=qkv.device, dtype=qkv.dtype)
    cfg = CONFIG["relpos"]
    grid = (triton.cdiv(longest, cfg["BM"]), h, lengths.shape[0])
    _relpos_attention_kernel[grid](qkv, pos_bias_u, pos, starts, lengths, out, scale, w, longest - 1, f8, H=h, DK=dk,
                                   BM=cfg["BM"], BN=cfg["BN"], num_warps=cfg["num_warps"],
                                   num_stages=cfg["num_stages"])
    return out


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
