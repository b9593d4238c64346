"""Decode attention: one query per (row, head) against a long cached K/V, split over the sequence.

A decode step reads the whole K/V cache to produce one output vector per head, so it is bound by
memory bandwidth, and with few rows x heads a kernel of one program per head would leave most SMs
idle. Flash-decoding cuts each head's sequence into ``splits`` chunks: every program streams its
chunk once (online softmax in float32) and writes an unnormalised partial result; the last program
of a (row, head) to finish (an arrival counter tells) rescales the partials to a common maximum and
sums them in split order, so one launch does it all and the result does not depend on timing.

Keys at or beyond a row's length are never loaded: the chunk loop ends at the length, which the
kernel reads from the device, so the launch grid depends only on shapes and the call can be
captured in a CUDA graph, and a short self-attention cache costs only its valid part: the splits
past the length return at once, and a row whose keys fit one split needs no combine.

Beam search keeps one window's cross-attention keys and values for all its beams: with ``group``
> 1, query rows ``b`` read K/V row ``b // group``. In half precision one program then takes all the
group's queries against each key block it loads, on the tensor cores (``tl.dot``, the group padded to
16 rows): a window's K/V comes from memory once per step, and its scores cost one matrix product per
block instead of ``group`` vector passes on the CUDA cores (at 16 windows of 5 beams at large-v3
sizes, these passes had made cross-attention several times its memory time). Float32 keeps the
CUDA-core kernel, group by group (tl.dot would round its inputs to tf32). A row's result depends only
on its own group's queries and K/V, never on how many groups run (the split plan is per K/V row).

A decode step's own key and value (``new_k``/``new_v``, at position length - 1) can be passed
fresh: the program whose chunk holds that position takes them from registers instead of the cache
and writes them into it, which saves the two cache-write launches per layer of a separate scatter.

Only CUDA runs these kernels (``TRITON_INTERPRET=1`` runs them on the CPU for tests); callers check
``triton_support.kernels_can_run`` and otherwise use ``torch.nn.functional.scaled_dot_product_attention``.
"""
from __future__ import annotations


import torch

from .. import settings
from .triton_support import (
    HAVE_TRITON, arrival_counters, kernels_can_run, pdl_options, sm_count, tl, triton,
)

if HAVE_TRITON:
    from .triton_support import pdl_enter, prefetch_l2

LOG2E = 1.4426950408889634
PROGRAMS_PER_SM = 2  # enough resident programs to keep loads in flight on every SM
MIN_CHUNK = 64  # below this a split's fixed costs (q load, partial write, combine) outweigh its keys
# Tuned on an H100 (bench/decode_attention.py, D=64, float16; BLOCK_N 32-256, 2-8 warps, 1-3
# stages, 2-8 programs per SM tried): these matched torch SDPA at full length (16 x 20 x 1500 keys
# at ~2.4 TB/s) and were within noise of the best everywhere else.
BLOCK_N = 32
NUM_WARPS = 4
NUM_STAGES = 3  # K/V blocks of this many iterations in flight (tl.range pipelines loads that feed no dot)
HEAD_DIMS = (64, 128)
CHUNK_ALIGN = 16  # chunks need not be whole blocks (a partial block loads only its valid keys)
INTERPRETER_SMS = 16  # the CPU interpreter has no SMs; a count that still exercises several splits
# The grouped (tensor-core) kernel: half precision only; key blocks of 128 rows, three in flight.
GROUPED_DTYPES = (torch.float16, torch.bfloat16)
GROUPED_BLOCK_N = 128
GROUPED_WARPS = 4
GROUPED_STAGES = 3
GROUPED_PROGRAMS_PER_SM = 2  # its split plan, per K/V row's heads (so a window's bits never depend on the batch)
GROUPED_MIN_CHUNK = 256


def _sm_count(device: torch.device) -> int:
    return sm_count(device, INTERPRETER_SMS)


def split_plan(seq_len: int, heads_rows: int, n_sm: int, programs_per_sm: int = PROGRAMS_PER_SM,
               min_chunk: int = MIN_CHUNK, align: int = CHUNK_ALIGN) -> tuple[int, int]:
    """(splits, chunk): as many splits as give every SM ``programs_per_sm`` programs, but no chunk
    shorter than ``min_chunk`` keys; the count is recomputed from the chunk rounded up to
    ``align`` keys (e.g. 132 SMs, 20 heads, 1500 keys: 14 wanted, 112-key chunks, 14 splits)."""
    wanted = -(-programs_per_sm * n_sm // heads_rows)
    splits = max(1, min(wanted, seq_len // min_chunk))
    chunk = -(-seq_len // splits)
    chunk = -(-chunk // align) * align
    return -(-seq_len // chunk), chunk


if HAVE_TRITON:

    @triton.jit
    def _program_rows(H: tl.constexpr, GROUP: tl.constexpr):
        """A ``_split_kernel`` program's (query row b, head h, K/V row before ``kvr``, b * H + h)."""
        bh = tl.program_id(0)
        if GROUP > 1:  # program (window * H + h) * GROUP + beam: a window's beams side by side
            wh = bh // GROUP
            h = (wh % H).to(tl.int64)
            kv_b = (wh // H).to(tl.int64)
            b = kv_b * GROUP + bh % GROUP
            bh = b * H + h  # partials and counters by query row
        else:
            b = (bh // H).to(tl.int64)  # int64: caches of many rows overflow 32-bit element offsets
            h = (bh % H).to(tl.int64)
            kv_b = b
        return b, h, kv_b, bh

    @triton.jit
    def _prefetch_split(k_ptr, v_ptr, kvr_ptr, kv_b, h, S, chunk, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                        D: tl.constexpr, HAS_ROWS: tl.constexpr, KEYS: tl.constexpr, LINE: tl.constexpr,
                        ROW_LINES: tl.constexpr):
        """The K and V lines of K/V row ``kv_b`` (read from kvr with HAS_ROWS), head ``h``, keys
        [split * chunk, +chunk) (KEYS >= chunk, a power of two; a key's D values span ROW_LINES 128-byte
        lines of LINE values), asked into L2 (``prefetch_l2``)."""
        if HAS_ROWS:
            kv_b = tl.load(kvr_ptr + kv_b).to(tl.int64)
        n = tl.program_id(1) * chunk + tl.arange(0, KEYS)
        lines = tl.arange(0, ROW_LINES) * LINE
        ok = ((n < S) & (n < tl.program_id(1) * chunk + chunk))[:, None] & (lines < D)[None, :]
        prefetch_l2(k_ptr + kv_b * sk_b + h * sk_h + n[:, None] * sk_s + lines[None, :], ok)
        prefetch_l2(v_ptr + kv_b * sv_b + h * sv_h + n[:, None] * sv_s + lines[None, :], ok)

    @triton.jit(do_not_specialize=["S"])
    def _split_kernel(q_ptr, k_ptr, v_ptr, len_ptr, nk_ptr, nv_ptr, kvr_ptr, out_ptr, part_ptr, ml_ptr, lock_ptr,
                      S, chunk, qk_scale,
                      sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, snk_b, snk_h, snv_b, snv_h, so_b, so_h,
                      H: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEN: tl.constexpr,
                      HAS_NEW: tl.constexpr, SPLITS: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr,
                      GROUP: tl.constexpr, HAS_ROWS: tl.constexpr, PREFETCH_KEYS: tl.constexpr = 0,
                      PREFETCH_LINE: tl.constexpr = 64, PREFETCH_ROW_LINES: tl.constexpr = 1):
        """Program (b*H + h, split): softmax over keys [split*chunk, min((split+1)*chunk, length)).
        Splits that start at or past the length (a short self-attention cache) return at once; of
        the others (SPLITS: the plan's count rounded up to a power of 2), each writes (acc, max, sum)
        and the last of the (b, h) to arrive combines them, or with one live split it writes the
        normalised output itself (the same bits: the combine would weigh it by exactly 1).
        With HAS_NEW the key/value at length - 1 come from nk/nv, and the chunk holding it stores them
        into the cache (no other program reads that position, so no ordering is needed). With
        HAS_ROWS the K/V row is read from kvr (indexed by the row's group). PREFETCH_KEYS (with PDL,
        no length, no new key: cross-attention, whose K/V and kvr the kernel ahead never writes): the
        split's K/V lines are asked into L2 before waiting on that kernel."""
        b, h, kv_b, bh = _program_rows(H, GROUP)
        if PDL:
            if PREFETCH_KEYS > 0:
                _prefetch_split(k_ptr, v_ptr, kvr_ptr, kv_b, h, S, chunk, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, D,
                                HAS_ROWS, PREFETCH_KEYS, PREFETCH_LINE, PREFETCH_ROW_LINES)
            pdl_enter()
        split = tl.program_id(1)
        if HAS_ROWS:
            kv_b = tl.load(kvr_ptr + kv_b).to(tl.int64)
        length = S
        if HAS_LEN:
            length = tl.minimum(tl.load(len_ptr + b).to(tl.int32), S)
        start = split * chunk
        live = tl.cdiv(length, chunk)  # splits holding keys (length >= 1: at least one)
        if start < length:
            end = tl.minimum(start + chunk, length)
            d = tl.arange(0, D)
            # scale and log2(e) folded into q: the scores come out in base 2, for exp2
            q = tl.load(q_ptr + b * sq_b + h * sq_h + d).to(tl.float32) * qk_scale
            k_row = k_ptr + kv_b * sk_b + h * sk_h
            v_row = v_ptr + kv_b * sv_b + h * sv_h
            pos = length - 1
            if HAS_NEW:
                k_new = tl.load(nk_ptr + b * snk_b + h * snk_h + d)
                v_new = tl.load(nv_ptr + b * snv_b + h * snv_h + d)
                if (pos >= start) & (pos < end):
                    tl.store(k_row + pos * sk_s + d, k_new)
                    tl.store(v_row + pos * sv_s + d, v_new)
            # Each of the BLOCK_N key slots keeps its own running max, sum and [D] accumulator, so the
            # loop needs no reduction across warps (a barrier per block); the slots merge once after it.
            # Masked-off keys are not loaded (garbage past the length may be NaN/inf) and score -inf.
            m_s = tl.full([BLOCK_N], float("-inf"), tl.float32)
            l_s = tl.zeros([BLOCK_N], tl.float32)
            acc_s = tl.zeros([BLOCK_N, D], tl.float32)
            for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
                n = n0 + tl.arange(0, BLOCK_N)
                ok = n < end
                if HAS_NEW:
                    fresh = n == pos
                    cached = ok & (n != pos)
                    kt = tl.load(k_row + n[:, None] * sk_s + d[None, :], mask=cached[:, None], other=0.0)
                    vt = tl.load(v_row + n[:, None] * sv_s + d[None, :], mask=cached[:, None], other=0.0)
                    kt = tl.where(fresh[:, None], k_new[None, :], kt).to(tl.float32)
                    vt = tl.where(fresh[:, None], v_new[None, :], vt).to(tl.float32)
                else:
                    kt = tl.load(k_row + n[:, None] * sk_s + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
                    vt = tl.load(v_row + n[:, None] * sv_s + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
                s = tl.where(ok, tl.sum(kt * q[None, :], axis=1), float("-inf"))
                m_new = tl.maximum(m_s, s)
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a slot with no key yet: 0, not NaN
                alpha = tl.exp2(m_s - m_ref)
                p = tl.exp2(s - m_ref)
                acc_s = acc_s * alpha[:, None] + p[:, None] * vt
                l_s = l_s * alpha + p
                m_s = m_new
            m = tl.max(m_s, axis=0)
            w = tl.exp2(m_s - tl.where(m == float("-inf"), 0.0, m))
            acc = tl.sum(w[:, None] * acc_s, axis=0)
            l = tl.sum(w * l_s, axis=0)
            if SPLITS > 1:
                if live > 1:
                    n_splits = tl.num_programs(1)
                    slot = bh.to(tl.int64) * n_splits + split
                    tl.store(part_ptr + slot * D + d, acc)
                    tl.store(ml_ptr + slot * 2, m)
                    tl.store(ml_ptr + slot * 2 + 1, l)
                    tl.debug_barrier()  # every thread's stores before one thread's release of the count
                    arrived = tl.atomic_add(lock_ptr + bh, 1, sem="acq_rel", scope="gpu")
                    if arrived == live - 1:
                        _combine(part_ptr, ml_ptr, out_ptr + b * so_b + h * so_h, bh.to(tl.int64) * n_splits,
                                 live, D, SPLITS)
                        tl.atomic_xchg(lock_ptr + bh, 0)  # ready for the next launch (graph replays reuse it)
                else:
                    tl.store(out_ptr + b * so_b + h * so_h + d, (acc / l).to(out_ptr.dtype.element_ty))
            else:
                tl.store(out_ptr + b * so_b + h * so_h + d, (acc / l).to(out_ptr.dtype.element_ty))

    @triton.jit
    def _combine(part_ptr, ml_ptr, out_row, first_slot, n_splits, D: tl.constexpr, SPLITS: tl.constexpr):
        """out = sum_i 2^(m_i - M) acc_i / sum_i 2^(m_i - M) l_i over the live splits of one (b, h)
        (the others count as (0, -inf, 0), what an empty split would have written: weight 0);
        split 0 always holds a valid key (lengths >= 1), so M is finite. Loads bypass L1: other SMs
        wrote the partials."""
        i = tl.arange(0, SPLITS)
        ok = i < n_splits
        slot = first_slot + i
        m = tl.load(ml_ptr + slot * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(ml_ptr + slot * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        w = tl.exp2(m - tl.max(m, axis=0))
        d = tl.arange(0, D)
        acc = tl.load(part_ptr + slot[:, None] * D + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)
        tl.store(out_row + d, out.to(out_row.dtype.element_ty))

    @triton.jit
    def _combine_group(part_ptr, ml_ptr, out_base, so_g, first_slot, n_splits, live, G: tl.constexpr,
                       BLOCK_G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
        """``_combine`` for the G query rows of one (b, h) at once, their first ``live`` of n_splits
        partials in slots first_slot + g * n_splits + split: one round of loads for all of them (row
        by row, the last program of a (b, h) had waited on G rounds of loads from L2 one after
        another)."""
        g = tl.arange(0, BLOCK_G)
        i = tl.arange(0, SPLITS)
        d = tl.arange(0, D)
        ok = (g[:, None] < G) & (i[None, :] < live)
        slot = first_slot + g[:, None] * n_splits + i[None, :]
        m = tl.load(ml_ptr + slot * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(ml_ptr + slot * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        top = tl.max(m, axis=1)
        w = tl.exp2(m - tl.where(top == float("-inf"), 0.0, top)[:, None])  # padding rows: weight 0, no NaN
        acc = tl.load(part_ptr + slot[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0,
                      cache_modifier=".cg")
        den = tl.where(g < G, tl.sum(w * l, axis=1), 1.0)  # padding rows: 0 / 0 otherwise (not stored)
        out = tl.sum(w[:, :, None] * acc, axis=1) / den[:, None]
        tl.store(out_base + g[:, None] * so_g + d[None, :], out.to(out_base.dtype.element_ty), mask=g[:, None] < G)


    @triton.jit(do_not_specialize=["S"])
    def _grouped_kernel(q_ptr, k_ptr, v_ptr, kvr_ptr, len_ptr, out_ptr, part_ptr, ml_ptr, lock_ptr, S, chunk, qk_scale,
                        sq_b, sq_h, sq_g, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_g,
                        H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr,
                        HAS_ROWS: tl.constexpr, HAS_LEN: tl.constexpr):
        """Program (b*H + h, split): the G queries of K/V row b, head h, over keys [split*chunk,
        min((split+1)*chunk, length)), flash-attention style: scores and the weighted values are
        tensor-core products of the [BLOCK_G, D] queries with each [BLOCK_N, D] block (probabilities
        rounded to the input dtype for the second, as flash attention does), softmax online in
        float32. Partials and the combine as in ``_split_kernel``, one arrival counter per (b, h) for
        its G rows. With HAS_ROWS group b reads K/V row kvr[b]; with HAS_LEN its length is len[b]
        (else S), and splits past it return at once, as in ``_split_kernel``."""
        if PDL:
            pdl_enter()
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        length = S
        if HAS_LEN:
            length = tl.minimum(tl.load(len_ptr + b).to(tl.int32), S)
        start = split * chunk
        live = tl.cdiv(length, chunk)
        if start < length:
            end = tl.minimum(start + chunk, length)
            g = tl.arange(0, BLOCK_G)
            d = tl.arange(0, D)
            g_ok = g < G
            q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :], mask=g_ok[:, None], other=0.0)
            kv_b = b
            if HAS_ROWS:
                kv_b = tl.load(kvr_ptr + b).to(tl.int64)
            k_row = k_ptr + kv_b * sk_b + h * sk_h
            v_row = v_ptr + kv_b * sv_b + h * sv_h
            m = tl.full([BLOCK_G], float("-inf"), tl.float32)
            l = tl.zeros([BLOCK_G], tl.float32)
            acc = tl.zeros([BLOCK_G, D], tl.float32)
            for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
                n = n0 + tl.arange(0, BLOCK_N)
                ok = n < end
                kt = tl.load(k_row + n[:, None] * sk_s + d[None, :], mask=ok[:, None], other=0.0)
                vt = tl.load(v_row + n[:, None] * sv_s + d[None, :], mask=ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(kt)) * qk_scale  # base-2 scores [BLOCK_G, BLOCK_N]
                s = tl.where(ok[None, :], s, float("-inf"))
                # every block holds a valid key (the loop stops at end), so the running max is finite
                m_new = tl.maximum(m, tl.max(s, axis=1))
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new[:, None])
                l = l * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
                m = m_new
            rows = bh.to(tl.int64) * G + g  # partial slots by query row: (b*H + h)*G + g
            out_rows = out_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :]
            if SPLITS > 1:
                if live > 1:
                    n_splits = tl.num_programs(1)
                    slot = rows * n_splits + split
                    tl.store(part_ptr + slot[:, None] * D + d[None, :], acc, mask=g_ok[:, None])
                    tl.store(ml_ptr + slot * 2, m, mask=g_ok)
                    tl.store(ml_ptr + slot * 2 + 1, l, mask=g_ok)
                    tl.debug_barrier()
                    arrived = tl.atomic_add(lock_ptr + bh, 1, sem="acq_rel", scope="gpu")
                    if arrived == live - 1:
                        _combine_group(part_ptr, ml_ptr, out_ptr + b * so_b + h * so_h, so_g,
                                       bh.to(tl.int64) * G * n_splits, n_splits, live, G, BLOCK_G, D, SPLITS)
                        tl.atomic_xchg(lock_ptr + bh, 0)
                else:
                    tl.store(out_rows, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
            else:
                tl.store(out_rows, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None, *,
                     scale: float | None = None, out: torch.Tensor | None = None,
                     new_k: torch.Tensor | None = None, new_v: torch.Tensor | None = None,
                     group: int = 1, kv_rows: torch.Tensor | None = None, prefetch: bool = False) -> torch.Tensor:
    """softmax(q k^T * scale) v per (row, head) over each row's first ``lengths[b]`` keys.

    q [B, H, D]; k, v [B, H, S, D] with any strides but a contiguous last dimension (views of a
    persistent cache); lengths: None (all S keys) or an int32/int64 tensor [B] on q's device, each
    >= 1 (keys past it are ignored, whatever they hold). D is 64 or 128; float16, bfloat16 or float32.
    new_k, new_v [B, H, D] (with lengths, k's dtype): this step's key and value, written into k and v
    at position lengths[b] - 1 and attended there (what a scatter into the cache before the call gives).
    group: query rows in consecutive groups of this size share one K/V row (k, v [B / group, H, S, D]),
    as a window's beams share its cross-attention keys; not with lengths or new_k/new_v. In half
    precision (q, k and v of one dtype) such groups run the tensor-core kernel (module docstring).
    kv_rows: None, or an integer tensor [B / group] on q's device: group g reads K/V row kv_rows[g]
    (k and v may then hold any number of rows), as a window admitted into a slot named by a graph's
    input reads that slot's cross-attention keys; the bits are those of k[kv_rows], v[kv_rows].
    prefetch: with PDL, and neither lengths nor new keys (cross-attention), each program asks L2 for
    its keys and values before it waits on the kernel ahead, which must not write them (nor kv_rows).
    Returns [B, H, D] in q's dtype, written into ``out`` when given (e.g. a graph's static buffer).
    """
    bsz, heads, dim = q.shape
    seq = k.shape[2]
    if group < 1 or bsz % group:
        raise ValueError(f"decode_attention: {bsz} query rows do not split into groups of {group}")
    if group > 1 and (lengths is not None or new_k is not None or new_v is not None):
        raise ValueError("decode_attention: group > 1 takes neither lengths nor new_k/new_v")
    kv_count = k.shape[0] if kv_rows is not None else bsz // group
    if k.shape != (kv_count, heads, seq, dim) or v.shape != k.shape:
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match"
                         + (f" (group {group})" if group > 1 else ""))
    if kv_rows is not None and (kv_rows.shape != (bsz // group,) or kv_rows.dtype not in (torch.int32, torch.int64)
                                or kv_rows.device != q.device):
        raise ValueError(f"decode_attention: kv_rows must be an int32/int64 tensor [{bsz // group}] on {q.device}")
    if dim not in HEAD_DIMS:
        raise ValueError(f"decode_attention: head size {dim} is not supported (64 or 128)")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("decode_attention: k and v need a contiguous last dimension")  # copying would read the whole cache
    if lengths is not None and (lengths.shape != (bsz,) or lengths.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"decode_attention: lengths must be an int32/int64 tensor [{bsz}]")
    has_new = new_k is not None or new_v is not None
    if has_new:
        if lengths is None or new_k is None or new_v is None:
            raise ValueError("decode_attention: new_k and new_v go together, and need lengths")
        if new_k.shape != q.shape or new_v.shape != q.shape or new_k.dtype != k.dtype or new_v.dtype != v.dtype:
            raise ValueError(f"decode_attention: new_k/new_v must be {tuple(q.shape)} in the cache's dtype")
        if new_k.stride(-1) != 1 or new_v.stride(-1) != 1:
            raise ValueError("decode_attention: new_k and new_v need a contiguous last dimension")
    else:
        new_k = new_v = q  # unused
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(bsz, heads, dim, device=q.device, dtype=q.dtype)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"decode_attention: out must be {tuple(q.shape)} with a contiguous last dimension")
    scale = dim ** -0.5 if scale is None else scale
    if group > 1 and q.dtype in GROUPED_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype:
        return _grouped(q, k, v, out, scale, group, kv_rows)
    # Planned from the heads of one row, not the batch: a row's result is then the same bits at any
    # batch size (batched transcription must equal one audio at a time).
    splits, chunk = split_plan(seq, heads, _sm_count(q.device))
    part, ml, locks = _split_workspace(out, bsz * heads, splits, bsz * heads)
    launch = pdl_options(q.device, bsz)
    if prefetch and launch["PDL"] and lengths is None and not has_new and not settings.prefetch_disabled():
        line = 128 // k.element_size()  # values of a 128-byte line
        launch.update(PREFETCH_KEYS=triton.next_power_of_2(chunk), PREFETCH_LINE=line,
                      PREFETCH_ROW_LINES=triton.next_power_of_2(-(-dim // line)))
    _split_kernel[(bsz * heads, splits)](
        q, k, v, lengths if lengths is not None else q, new_k, new_v, kv_rows if kv_rows is not None else q,
        out, part, ml, locks, seq, chunk, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1), out.stride(0), out.stride(1),
        H=heads, D=dim, BLOCK_N=BLOCK_N, HAS_LEN=lengths is not None, HAS_NEW=has_new,
        SPLITS=triton.next_power_of_2(splits), NUM_STAGES=NUM_STAGES, GROUP=group, HAS_ROWS=kv_rows is not None,
        num_warps=NUM_WARPS, **launch)
    return out


def _split_workspace(out: torch.Tensor, query_heads: int, splits: int, counters: int):
    """(partials, (max, sum) pairs, arrival counters) for a launch of ``splits`` splits per query
    head; with one split the kernel writes ``out`` directly and these are placeholders."""
    if splits == 1:
        return out, out, out
    dim = out.shape[-1]
    part = torch.empty(query_heads * splits * dim, device=out.device, dtype=torch.float32)
    ml = torch.empty(query_heads * splits * 2, device=out.device, dtype=torch.float32)
    return part, ml, arrival_counters(out.device, counters)


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float,
             group: int, kv_rows: torch.Tensor | None) -> torch.Tensor:
    """group > 1 in half precision: query rows ``w * group + i`` seen as [K/V rows, H, group, D]."""
    bsz, heads, _ = q.shape
    return _launch_grouped(q, k, v, out, scale, group, kv_rows, None, q_strides=(group * q.stride(0), q.stride(1),
                           q.stride(0)), out_strides=(group * out.stride(0), out.stride(1), out.stride(0)),
                           kv_count=bsz // group, heads=heads, min_chunk=GROUPED_MIN_CHUNK, rows=bsz)


def _launch_grouped(q, k, v, out, scale, group, kv_rows, lengths, q_strides, out_strides, kv_count, heads,
                    min_chunk, rows, stages=GROUPED_STAGES):
    """The tensor-core kernel over ``kv_count`` K/V rows of ``heads`` heads, ``group`` queries each,
    found through ``q_strides``/``out_strides`` (per K/V row, head, query). The split plan comes
    from one row's heads, so a row's bits never depend on the batch."""
    dim, seq = k.shape[-1], k.shape[2]
    block_n = GROUPED_BLOCK_N * 128 // max(dim, 128)  # the same K/V bytes a block at D 256
    splits, chunk = split_plan(seq, heads, _sm_count(q.device), GROUPED_PROGRAMS_PER_SM, min_chunk, block_n)
    part, ml, locks = _split_workspace(out, kv_count * heads * group, splits, kv_count * heads)
    _grouped_kernel[(kv_count * heads, splits)](
        q, k, v, kv_rows if kv_rows is not None else q, lengths if lengths is not None else q, out, part, ml, locks,
        seq, chunk, scale * LOG2E, *q_strides, k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *out_strides,
        H=heads, G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=block_n,
        SPLITS=triton.next_power_of_2(splits), NUM_STAGES=stages, HAS_ROWS=kv_rows is not None,
        HAS_LEN=lengths is not None, num_warps=GROUPED_WARPS, **pdl_options(q.device, rows))
    return out


GQA_HEAD_DIMS = (64, 128, 256)
GQA_MIN_CHUNK = 128  # a language model's cache is read up to each row's length: shorter splits pay off
# Two stages: Qwen3-8B's heads over 560 of 640 cached keys on an H100, 36 layers, per layer: 6.1 us at
# one row (three stages: 6.1), 14.3 at 8 (17.3), 35.1 at 32 (50.0), against 16.9 / 26.2 / 50.5 for
# PyTorch's matmul, softmax, matmul over the whole cache.
GQA_STAGES = 2


def gqa_can_run(q: torch.Tensor, k: torch.Tensor) -> bool:
    """``gqa_decode_attention`` serves these: Triton on their device, one half dtype, a head size
    it knows, query heads a multiple of the K/V heads."""
    return (kernels_can_run(q, q.dtype, interpreter=True) and k.dtype == q.dtype and q.shape[-1] in GQA_HEAD_DIMS
            and q.shape[1] % k.shape[1] == 0)


def gqa_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, *,
                         scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """A decoder-only model's step with grouped-query attention: query head j of row b attends K/V
    head j // G (G = query heads / K/V heads, transformers' ``repeat_kv`` order) over the row's
    first ``lengths[b]`` keys.

    q [B, Hq, D] (contiguous last dimension); k, v [B, Hkv, S, D] with any strides but a contiguous
    last dimension (views of the cache); lengths int32/int64 [B] on q's device, each >= 1. Half
    precision, one dtype; D 64, 128 or 256. The G queries of a K/V head run as one tensor-core
    product per key block, so each key and value is read once per step. Returns [B, Hq, D] in q's
    dtype, written into ``out`` when given.
    """
    bsz, q_heads, dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    if q.dtype not in GROUPED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"gqa_decode_attention: q, k, v must share a half dtype ({q.dtype}, {k.dtype}, {v.dtype})")
    if k.shape != (bsz, kv_heads, seq, dim) or v.shape != k.shape or q_heads % kv_heads:
        raise ValueError(f"gqa_decode_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if dim not in GQA_HEAD_DIMS:
        raise ValueError(f"gqa_decode_attention: head size {dim} is not supported {GQA_HEAD_DIMS}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("gqa_decode_attention: k and v need a contiguous last dimension")
    if lengths.shape != (bsz,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != q.device:
        raise ValueError(f"gqa_decode_attention: lengths must be an int32/int64 tensor [{bsz}] on {q.device}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(bsz, q_heads, dim, device=q.device, dtype=q.dtype)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"gqa_decode_attention: out must be {tuple(q.shape)} with a contiguous last dimension")
    group = q_heads // kv_heads
    scale = dim ** -0.5 if scale is None else scale
    return _launch_grouped(q, k, v, out, scale, group, None, lengths,
                           q_strides=(q.stride(0), group * q.stride(1), q.stride(1)),
                           out_strides=(out.stride(0), group * out.stride(1), out.stride(1)),
                           kv_count=bsz, heads=kv_heads, min_chunk=GQA_MIN_CHUNK, rows=bsz, stages=GQA_STAGES)


@torch.library.custom_op("ostinato::gqa_decode_attention", mutates_args=())
def gqa_decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """``gqa_decode_attention`` as one opaque operator, so that a compiled decode step calls it as it
    is (torch.compile would otherwise trace into the launcher's host-side planning). The step's key
    and value are written into the cache before it (a scatter the compiler fuses with the rotary
    embedding; passing them in to be written by this kernel measured slower: 8.1 against 6.5 us a
    layer for Qwen3-8B at one row on an H100)."""
    return gqa_decode_attention(q, k, v, lengths, scale=scale)


@gqa_decode_attention_op.register_fake
def _(q, k, v, lengths, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
