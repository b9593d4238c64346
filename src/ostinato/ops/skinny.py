"""Skinny decode-step operators: residual add + LayerNorm, and Linear for a few rows (M up to ~128).

A Whisper decode step feeds one token per row, so every Linear is a [M, K] x [K, N] product with M
tiny: the time is reading the weight once, and cuBLAS at M=1 reaches only about a third of the
memory bandwidth, while the LayerNorms, residual adds and GELUs around it are separate launches.

``linear`` streams every weight tile exactly once and multiplies it with all M rows at once (``tl.dot``
with M padded to 16, its smallest size). With few output columns (N=1280) there are too few column
blocks to occupy every SM, so K is split too: each (column block, K chunk) program writes a float32
partial to a workspace and counts itself in on a per-tile arrival counter; the last program of a
tile to arrive sums the partials in split order (so the result does not depend on which one is
last) and applies bias, GELU and the residual, then zeroes the counter for the next launch. One
launch per linear either way: a separate reduce kernel cost a launch per linear (about 1.8 us each
on an H100, 192 per large-v3 step). With many rows (a beam step of 16 windows: 80) each program
takes several consecutive chunks, so the launch stays one wave; the sum's order stays the one-row
plan's, so a row's bits never depend on the others (``linear_plan``).
``add_layer_norm`` folds the residual add into the following LayerNorm: one program per row.
A language model's decode step (``linear_op``) folds more into the products themselves: the
residual add and the output's per-block square sums in the epilogue, and the next product's RMSNorm
(or SwiGLU of its input's halves) applied to each x tile as it is loaded, so that no norm kernel
runs between them.

Launch parameters depend only on shapes and the SM count (no autotuning, no host synchronisation),
so both run while the caller forbids syncs and can be captured in CUDA graphs. Only CUDA runs them
(``TRITON_INTERPRET=1`` runs them on the CPU for tests); callers check
``triton_support.kernels_can_run`` and otherwise
use plain PyTorch.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import settings
from .triton_support import (
    HAVE_TRITON, arrival_counters, kernels_can_run, pdl_options, sm_count, tl, triton,
)

if HAVE_TRITON:
    from .triton_support import pdl_enter, prefetch_l2, swiglu_rounded

PROGRAMS_PER_SM = 2  # two resident programs per SM keep enough weight loads in flight
BLOCK_N = 64  # weight rows per program
# A half-precision product whose weight is at most this many bytes (tiny.en's layers, base's attention, small's
# 768 x 768) runs one K chunk a program in blocks of SMALL_BLOCK_N weight rows, where split K would add a second
# pass over partials to a latency-bound chain: tiny.en's step on an H200 0.170 -> 0.155 ms at one row, 0.254 ->
# 0.232 at 16 (a probe before the greedy rules' split: 64 columns without split K 0.204 / 0.279 against 0.209 /
# 0.293 split, 16 columns 0.202 / 0.299, 32 columns 0.198 / 0.272).
SMALL_WEIGHT_BYTES = 3 << 19
SMALL_BLOCK_N = 32
WHOLE_K_MAX_BLOCK_M = 64  # (64 + 32) x 256 half-precision elements a stage, three stages: 144 KiB
TILE_BYTES = 16384  # BLOCK_N x BLOCK_K weight bytes per pipeline stage: K 128 in half, 64 in float32
MAX_WORKSPACE_RATIO = 1.0  # partial-sum traffic (float32 write + read, mostly in L2) <= the weight bytes
NUM_STAGES = 3  # software pipelining depth of the K loop (cp.async on sm80+), one chunk a program
INTERPRETER_SMS = 16  # the CPU interpreter has no SMs; a count that still exercises split-K


def _sm_count(device: torch.device) -> int:
    return sm_count(device, INTERPRETER_SMS)


ROW_BLOCK = 16  # rows per program: the smallest tl.dot side
MAX_BLOCK_M = 128  # rows per program without split K
ROW_BLOCKS_WITH_SPLIT_K = (16, 32, 64)  # row block heights tried for many rows with split K
GROUPED_PROGRAMS_PER_SM = 1  # several row blocks: K chunks go to programs in groups, one program an SM
GROUPED_STAGES = 4  # pipelining depth then: one program an SM has the shared memory for a deeper one


def block_rows(m: int, splits: int, n_blocks: int, n_sm: int) -> int:
    """Rows per program. Without split K (the vocabulary projection), rows past 16 go in blocks of up
    to 128: each weight tile is then read once for all of them (at 80 rows of large-v3: 77 us instead
    of 227 on an H100). With split K, the lowest block (16, 32 or 64 rows) whose launch is one program
    an SM: a (column block, row block) pair each, K chunks in groups (with one row block: a program a
    chunk). Lower blocks read each weight tile more often but have fewer rows to wait on; a launch of
    several waves is slower than either (at 80 rows of large-v3 on an H100, 3840x1280: 8.6 us at 64
    rows against 10.5 at 32; 1280x1280 6.6 us at 16 against 9.2 at 32). When none is one wave (5120
    columns), 16-row blocks while they fit two programs an SM, else 32. A row's bits do not depend
    on the block's height (checked on an H100 in half precision and float32: dev/skinny_check.py)."""
    if m <= ROW_BLOCK:
        return ROW_BLOCK
    if splits == 1:
        return min(MAX_BLOCK_M, 1 << (m - 1).bit_length())
    for rows in ROW_BLOCKS_WITH_SPLIT_K:
        m_blocks = -(-m // rows)
        if n_blocks * (m_blocks if m_blocks > 1 else splits) <= GROUPED_PROGRAMS_PER_SM * n_sm:
            return rows
        if m_blocks == 1:
            break
    return ROW_BLOCK if -(-m // ROW_BLOCK) * n_blocks <= PROGRAMS_PER_SM * n_sm else 2 * ROW_BLOCK


def linear_plan(m: int, n: int, k: int, n_sm: int, elem_bytes: int = 2, one_wave: bool = False,
                whole_k: bool = False) -> dict:
    """Block sizes and split-K for ``linear``.

    The sum (``splits`` K chunks of ``tiles`` BLOCK_K tiles each, the chunks' partials added in chunk
    order) depends on (N, K) only, so a row's result is the same bits whatever M is: batched decoding
    equals decoding one window at a time. It is chosen for one row block: enough (column block, K
    chunk) programs for ``PROGRAMS_PER_SM`` per SM, and no more chunks than keep the float32
    partials' traffic under ``MAX_WORKSPACE_RATIO`` x the weight bytes. E.g. 132 SMs, M=1: 1280x1280
    -> 20 column blocks x 10 chunks; 5120x1280 -> 80 x 4 (3 tiles each); 51866x1280 -> 811 x 1.

    How the chunks go to programs depends on M: with several row blocks each program takes ``group``
    consecutive chunks (the first program adds its chunks' partials itself, the others store theirs),
    so the launch stays near ``GROUPED_PROGRAMS_PER_SM`` per SM instead of growing with the rows; the
    sum's order is unchanged. ``stages`` is the pipelining depth: deeper for such grouped launches.

    ``one_wave``: no more (column block, K chunk) programs than ``PROGRAMS_PER_SM`` per SM where the
    column blocks allow it (fewer chunks, rounded down): a launch that spills a few programs into a
    second wave waits on them, and with PDL the next launch's waiting programs take their room.
    Qwen3-8B's 36 layers of decode linears at one row on an H100: 5.45 ms with PDL this way, 5.61
    without PDL the other way, 6.80 with PDL the other way.

    ``whole_k``: one K chunk a program in ``SMALL_BLOCK_N``-column blocks (``small_product``): no
    partials, no arrival count, no second pass over them."""
    block_n = SMALL_BLOCK_N if whole_k else BLOCK_N
    block_k = TILE_BYTES // (block_n * elem_bytes)
    n_blocks = -(-n // block_n)
    k_tiles = -(-k // block_k)
    wanted = (max(1, PROGRAMS_PER_SM * n_sm // n_blocks) if one_wave
              else -(-PROGRAMS_PER_SM * n_sm // n_blocks))
    # partial traffic 2 * splits * rows * N * 4 bytes vs weight N * K * elem_bytes
    cap = 1 if whole_k else max(1, int(MAX_WORKSPACE_RATIO * k * elem_bytes / (8 * ROW_BLOCK)))
    splits = max(1, min(wanted, cap, k_tiles))
    tiles = -(-k_tiles // splits)
    splits = -(-k_tiles // tiles)
    block_m = block_rows(m, splits, n_blocks, n_sm)
    if whole_k:  # its K tiles are twice as wide: three stages of 128 rows would overflow shared memory
        block_m = min(block_m, WHOLE_K_MAX_BLOCK_M)
    m_blocks = -(-m // block_m)
    group = 1  # one row block: one chunk a program, as the plan was made
    if m_blocks > 1:
        budget = GROUPED_PROGRAMS_PER_SM * n_sm
        group = next(g for g in range(1, splits + 1) if n_blocks * m_blocks * -(-splits // g) <= budget
                     or g == splits)
    return dict(block_m=block_m, block_n=block_n, block_k=block_k, m_blocks=m_blocks, n_blocks=n_blocks,
                tiles=tiles, splits=splits, group=group, programs_k=-(-splits // group),
                stages=GROUPED_STAGES if group > 1 else NUM_STAGES)


def small_product(n: int, k: int, elem_bytes: int) -> bool:
    """Whether a product's weight is small enough (``SMALL_WEIGHT_BYTES``) for ``linear_plan(whole_k=True)``."""
    return n * k * elem_bytes <= SMALL_WEIGHT_BYTES


if HAVE_TRITON:

    @triton.jit
    def _epilogue(acc, rows, cols, mask, N, b_ptr, r_ptr, srm, o_ptr, som,
                  HAS_BIAS: tl.constexpr, GELU: tl.constexpr, HAS_RES: tl.constexpr,
                  sso_ptr, ss_col, ss_stride, M, SS_OUT: tl.constexpr):
        """gelu(acc + bias) + residual in float32, one rounding to the output dtype; rows/cols broadcast
        to acc's shape (2-D tile in the matmul kernel, one row segment in the reduce kernel). With
        SS_OUT each row's sum of squares of the rounded outputs of this column block goes to
        sso[row, ss_col] (what an RMSNorm of the output needs, summed over the blocks by its reader)."""
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if GELU:  # exact erf GELU, as torch.nn.functional.gelu(approximate="none")
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        if HAS_RES:
            acc += tl.load(r_ptr + rows * srm + cols, mask=mask, other=0.0).to(tl.float32)
        y = acc.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + rows * som + cols, y, mask=mask)
        if SS_OUT:
            yf = tl.where(mask, y.to(tl.float32), 0.0)
            tl.store(sso_ptr + rows * ss_stride + ss_col, tl.sum(yf * yf, axis=1, keep_dims=True), mask=rows < M)

    @triton.jit
    def _prefetch_weights(w_ptr, swn, N, K, pid_n, k_start, k_len, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
                          LINES: tl.constexpr):
        """Ask L2 for the 128-byte lines of weight rows [pid_n * BLOCK_N, +BLOCK_N), columns [k_start,
        k_start + k_len): LINES lines of STEP elements a row (a power of two; those past the range or
        the weight are skipped). Weights never depend on the kernel ahead, so under PDL this runs while
        that kernel does: a step of many small, latency-bound products then streams its next product's
        weights from memory meanwhile instead of one product at a time."""
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = k_start + tl.arange(0, LINES) * STEP
        ok = (cols < N)[:, None] & ((ks < K) & (ks < k_start + k_len))[None, :]
        prefetch_l2(w_ptr + cols.to(tl.int64)[:, None] * swn + ks[None, :], ok)

    @triton.jit
    def _dot_into(acc, xt, wt, FP32: tl.constexpr):
        """acc + xt @ wt^T on the tensor cores; float32 in IEEE precision (tensor cores would round
        float32 operands to tf32)."""
        if FP32:
            acc += tl.dot(xt, tl.trans(wt), input_precision="ieee")
        else:
            acc += tl.dot(xt, tl.trans(wt))
        return acc

    @triton.jit
    def _input_load(x_rows, k, mask, K, nw_ptr, NORM: tl.constexpr, SWIGLU: tl.constexpr):
        """The raw loads behind one x tile of ``_input_transform``: (x, up or x, norm weight or x)."""
        xt = tl.load(x_rows + k[None, :], mask=mask, other=0.0)
        up = xt
        w = xt
        if SWIGLU:
            up = tl.load(x_rows + K + k[None, :], mask=mask, other=0.0)
        if NORM:
            w = tl.load(nw_ptr + k, mask=k < K, other=0.0)
        return xt, up, w

    @triton.jit
    def _input_transform(xt, up, w, rstd, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, SWIGLU: tl.constexpr):
        """The x tile the product takes: with SWIGLU silu(x[:, k]) * x[:, K + k] (the gate's columns
        first), with NORM the RMSNorm of the row (``rstd`` per row, weight w), each op's result
        rounded to the input dtype as ``models.llm.fusion`` rounds them."""
        if SWIGLU:
            xt = swiglu_rounded(xt, up)
        if NORM:
            h = xt.to(tl.float32) * rstd[:, None]
            wf = w.to(tl.float32)
            if ZERO_CENTERED:  # Qwen3-Next / Qwen3.5: scale in float32, then one rounding
                xt = (h * (1.0 + wf)[None, :]).to(xt.dtype)
            else:  # Llama / Qwen3: the normalised row rounded, then times the weight
                xt = (h.to(xt.dtype).to(tl.float32) * wf[None, :]).to(xt.dtype)
        return xt

    @triton.jit
    def _input_tile(x_rows, k, mask, K, rstd, nw_ptr, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                    SWIGLU: tl.constexpr):
        xt, up, w = _input_load(x_rows, k, mask, K, nw_ptr, NORM, SWIGLU)
        return _input_transform(xt, up, w, rstd, NORM, ZERO_CENTERED, SWIGLU)

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr, ws_ptr, lock_ptr, M, N, K, sxm, swn, srm, som,
                       ss_ptr, ss_parts, nw_ptr, eps, sso_ptr,
                       TILES: tl.constexpr, SPLITS: tl.constexpr, GROUP: tl.constexpr, PROGRAMS_K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       FP32: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, HAS_RES: tl.constexpr,
                       PDL: tl.constexpr, NORM: tl.constexpr = False, SS_BLOCK: tl.constexpr = 1,
                       ZERO_CENTERED: tl.constexpr = False, SWIGLU: tl.constexpr = False,
                       SS_OUT: tl.constexpr = False, PREFETCH_STEP: tl.constexpr = 64,
                       PREFETCH_LINES: tl.constexpr = 0):
        """Program (column block, group of GROUP K chunks, row block): each chunk's partial
        acc[BLOCK_M, BLOCK_N] over TILES BLOCK_K tiles. The sum is ((p0 + p1) + p2) + ... in chunk
        order whoever computes it: the first group's program adds its partials as they finish and
        stores that prefix, the others store theirs, and the last of a tile's programs to arrive
        continues the sum. Only the last chunk runs past K (its loads are masked), so every program
        has the same compile-time trip count, which the compiler pipelines (and a runtime loop bound
        would not run in the interpreter under numpy 2.4, whose scalars there are 1-element arrays).
        NORM, SWIGLU: the x tiles pass through ``_input_tile`` (the norm's rstd per row from the
        ss_parts square sums of ss[row]); SS_OUT: the output rows' square sums per column block.
        PREFETCH_LINES (with PDL): the program's weight lines are asked into L2 before it waits on the
        kernel ahead (``_prefetch_weights``)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        if PDL:
            if PREFETCH_LINES > 0:
                _prefetch_weights(w_ptr, swn, N, K, pid_n, pid_k * (GROUP * TILES * BLOCK_K),
                                  GROUP * TILES * BLOCK_K, BLOCK_N, PREFETCH_STEP, PREFETCH_LINES)
            pdl_enter()
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        kk = tl.arange(0, BLOCK_K)
        row_ok = rows < M
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * sxm
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * swn  # int64: vocab x d exceeds 2^31 bytes at fp32 x 2
        ws_cols = ws_ptr + cols[None, :]
        rstd = tl.zeros([BLOCK_M], tl.float32)
        if NORM:
            parts = tl.arange(0, SS_BLOCK)
            sums = tl.load(ss_ptr + rows[:, None] * ss_parts + parts[None, :],
                           mask=row_ok[:, None] & (parts[None, :] < ss_parts), other=0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(sums, axis=1) / K + eps)
        if GROUP == 1:  # one chunk: its partial, the loop of before (the grouped loop's selects and
            # per-chunk stores, used for every launch, made 5-row launches 0.1-0.4 us slower on an H100)
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            k0 = pid_k * (TILES * BLOCK_K)
            if NORM or SWIGLU:
                # The transformed x tiles are loaded one iteration ahead: a load whose value goes
                # through element-wise ops before the product is not pipelined by the compiler, and
                # every iteration waited on it (+5 us per Qwen3-8B q/k/v product on an H100).
                k = k0 + kk
                xr, upr, wr = _input_load(x_rows, k, row_ok[:, None] & (k < K)[None, :], K, nw_ptr, NORM, SWIGLU)
                for i in range(0, TILES):
                    k = k0 + i * BLOCK_K + kk
                    k_ok = k < K
                    xt = _input_transform(xr, upr, wr, rstd, NORM, ZERO_CENTERED, SWIGLU)
                    kn = k + BLOCK_K
                    xr, upr, wr = _input_load(x_rows, kn, row_ok[:, None] & ((kn < K) & (i + 1 < TILES))[None, :], K,
                                              nw_ptr, NORM, SWIGLU)
                    wt = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                    acc = _dot_into(acc, xt, wt, FP32)
            else:
                for i in range(0, TILES):
                    k = k0 + i * BLOCK_K + kk
                    k_ok = k < K
                    xt = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    wt = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                    acc = _dot_into(acc, xt, wt, FP32)
            if PROGRAMS_K > 1:
                slot = (pid_k * M + rows).to(tl.int64)
                tl.store(ws_cols + slot[:, None] * N, acc, mask=mask)
            total = acc
        else:  # GROUP chunks: each partial from zero; the first group adds its own as they finish
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            first = pid_k * GROUP
            for i in range(0, GROUP * TILES):
                k = (first * TILES + i) * BLOCK_K + kk
                k_ok = k < K
                xt = _input_tile(x_rows, k, row_ok[:, None] & k_ok[None, :], K, rstd, nw_ptr, NORM, ZERO_CENTERED,
                                 SWIGLU)
                wt = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                if TILES > 1:
                    acc = tl.where(i % TILES == 0, 0.0, acc)
                else:
                    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                acc = _dot_into(acc, xt, wt, FP32)
                end = i % TILES == TILES - 1
                # A select, never the bare product: with one tile a chunk, "total + dot" would be folded
                # into the dot's accumulator, a different rounding from adding the chunk's partial (rows
                # past M add nothing, which no store sees, and the runtime mask keeps the select).
                total += tl.where(end & row_ok[:, None], acc, 0.0)
                if PROGRAMS_K > 1:  # past the first group, each chunk's partial goes to its own slot
                    chunk = first + i // TILES
                    slot = (chunk * M + rows).to(tl.int64)
                    tl.store(ws_cols + slot[:, None] * N, acc, mask=mask & end & (pid_k > 0) & (chunk < SPLITS))
            if PROGRAMS_K > 1:
                tl.store(ws_cols + rows.to(tl.int64)[:, None] * N, total, mask=mask & (pid_k == 0))
        if PROGRAMS_K > 1:
            # Every thread's partials are stored before one thread's release of the arrival count.
            tl.debug_barrier()
            lock = lock_ptr + tl.program_id(2) * tl.num_programs(0) + pid_n
            arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if arrived == PROGRAMS_K - 1:
                # The last to arrive: the sum in chunk order (the first group's slot holds the sum of
                # its chunks), as a separate reduce kernel would take it.
                total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                total += tl.load(ws_cols + rows.to(tl.int64)[:, None] * N, mask=mask, other=0.0,
                                 cache_modifier=".cg")  # from L2: other SMs wrote these
                for s in range(GROUP, SPLITS):
                    part = (s * M + rows).to(tl.int64)
                    total += tl.load(ws_cols + part[:, None] * N, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(total, rows.to(tl.int64)[:, None], cols[None, :], mask, N, b_ptr, r_ptr, srm, o_ptr,
                          som, HAS_BIAS, GELU, HAS_RES, sso_ptr, pid_n, tl.num_programs(0), M, SS_OUT)
                tl.atomic_xchg(lock, 0)  # ready for the next launch (graph replays reuse the counters)
        else:
            _epilogue(total, rows.to(tl.int64)[:, None], cols[None, :], mask, N, b_ptr, r_ptr, srm, o_ptr, som,
                      HAS_BIAS, GELU, HAS_RES, sso_ptr, pid_n, tl.num_programs(0), M, SS_OUT)

    @triton.jit
    def _norm_row(v, ok, N, eps, w_ptr, b_ptr, cols, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
        mean = tl.sum(v, axis=0) / N
        d = tl.where(ok, v - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)  # two-pass variance: no cancellation
        y = d * rstd
        if HAS_W:
            y *= tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_B:
            y += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        return y

    @triton.jit
    def _add_layer_norm_kernel(x_ptr, u_ptr, w_ptr, b_ptr, nx_ptr, y_ptr, N, eps, alpha, sxm, sum_, snm, sym,
                               w2_ptr, b2_ptr, z_ptr, eps2, szm,
                               BLOCK: tl.constexpr, HAS_U: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                               HAS_Z: tl.constexpr, PDL: tl.constexpr, STORE_X: tl.constexpr = True):
        """Row r: new_x = x + alpha * u rounded to the dtype (what the unfused ``x.add_(u, alpha=alpha)``
        stores, and what the next layer adds to; stored unless STORE_X is off), then LayerNorm of that
        rounded row in float32; with HAS_Z also a second LayerNorm (w2, b2, eps2) of the first one's
        rounded output, into z."""
        if PDL:
            pdl_enter()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(x_ptr + row * sxm + cols, mask=ok, other=0.0)
        if HAS_U:
            # float32 sum then one rounding: float32 holds > 2p+2 bits of a half/bfloat16 p, so this
            # equals the correctly rounded sum that PyTorch stores
            u = tl.load(u_ptr + row * sum_ + cols, mask=ok, other=0.0)
            x = (x.to(tl.float32) + alpha * u.to(tl.float32)).to(nx_ptr.dtype.element_ty)
            if STORE_X:
                tl.store(nx_ptr + row * snm + cols, x, mask=ok)
        y = _norm_row(x.to(tl.float32), ok, N, eps, w_ptr, b_ptr, cols, HAS_W, HAS_B).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * sym + cols, y, mask=ok)
        if HAS_Z:
            z = _norm_row(y.to(tl.float32), ok, N, eps2, w2_ptr, b2_ptr, cols, HAS_W, HAS_B)
            tl.store(z_ptr + row * szm + cols, z.to(z_ptr.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor, name: str, writable: bool = False) -> torch.Tensor:
    """``t`` as a [rows, last] view with a unit last stride; inputs that are not viewable are copied,
    outputs must be views (their writes have to land in the caller's tensor)."""
    if t.dim() == 2 and t.stride(-1) == 1:
        return t
    try:
        v = t.view(-1, t.shape[-1])
    except RuntimeError:
        v = None
    if v is not None and v.stride(-1) == 1:
        return v
    if writable:
        raise ValueError(f"{name} must be viewable as [rows, {t.shape[-1]}] with a contiguous last dimension")
    return t.reshape(-1, t.shape[-1]).contiguous()


def add_layer_norm(x: torch.Tensor, residual_update: torch.Tensor | None, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, eps: float = 1e-5, *, out_residual: torch.Tensor | None = None,
                   out: torch.Tensor | None = None, alpha: float = 1.0, then: tuple | None = None,
                   store_residual: bool = True):
    """(new_x, LayerNorm(new_x)) with new_x = x + alpha * residual_update, in one launch.

    x, residual_update [..., N] (any row strides, contiguous last dimension), same dtype; weight and
    bias [N] (any float dtype) or None. new_x is rounded to x's dtype exactly as ``x + residual_update``
    is, and the norm is computed from it in float32 and stored in x's dtype. ``out_residual`` receives
    new_x (pass ``x`` itself to update it in place), ``out`` the norm. With ``residual_update=None`` it
    is a plain LayerNorm and new_x is ``x``. ``then=(weight2, bias2, eps2)`` (both or neither of the
    weights given, as for the first): a second LayerNorm of the stored norm, returned third (the next
    layer's first norm, without reading the row again). ``store_residual=False``: new_x is not
    stored and None is returned in its place (when only its norm is wanted).
    """
    n = x.shape[-1]
    if residual_update is not None and (residual_update.shape != x.shape or residual_update.dtype != x.dtype):
        raise ValueError(f"add_layer_norm: x {tuple(x.shape)} {x.dtype} and update "
                         f"{tuple(residual_update.shape)} {residual_update.dtype} do not match")
    x2 = _rows(x, "x")
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    y2 = _rows(y, "out", writable=True)
    if residual_update is None:
        nx = x
        nx2 = u2 = x2  # unused
    else:
        u2 = _rows(residual_update, "residual_update")
        if not store_residual:
            nx, nx2 = None, x2  # never written
        else:
            nx = torch.empty_like(x, memory_format=torch.contiguous_format) if out_residual is None else out_residual
            nx2 = _rows(nx, "out_residual", writable=True)
    if y.shape != x.shape or (nx is not None and nx.shape != x.shape):
        raise ValueError(f"add_layer_norm: outputs must have x's shape {tuple(x.shape)}")
    z = z2 = None
    w2 = b2 = None
    eps2 = 0.0
    if then is not None:
        w2, b2, eps2 = then
        if (w2 is None) != (weight is None) or (b2 is None) != (bias is None):
            raise ValueError("add_layer_norm: the second norm must have the same affine terms as the first")
        z = torch.empty_like(x, memory_format=torch.contiguous_format)
        z2 = _rows(z, "then", writable=True)
    block = triton.next_power_of_2(n)
    _add_layer_norm_kernel[(x2.shape[0],)](
        x2, u2, weight if weight is not None else x2, bias if bias is not None else x2, nx2, y2, n, eps, float(alpha),
        x2.stride(0), u2.stride(0), nx2.stride(0), y2.stride(0),
        w2 if w2 is not None else x2, b2 if b2 is not None else x2, z2 if z2 is not None else y2, float(eps2),
        z2.stride(0) if z2 is not None else 0, BLOCK=block,
        HAS_U=residual_update is not None, HAS_W=weight is not None, HAS_B=bias is not None, HAS_Z=then is not None,
        STORE_X=store_residual, num_warps=max(1, min(8, block // 256)), **pdl_options(x.device, x2.shape[0]))  # ~8 elements per thread
    return (nx, y) if then is None else (nx, y, z)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, gelu: bool = False, out: torch.Tensor | None = None,
           pdl: bool = True, norm: tuple | None = None, swiglu: bool = False, square_sums: bool = False,
           one_wave: bool = False, prefetch: bool = False, whole_k: bool | None = None):
    """gelu?(x @ weight^T + bias) + residual for a few rows, accumulated in float32, one rounding.

    x [..., K] (any row strides, contiguous last dimension); weight [N, K] (nn.Linear layout, rows
    contiguous); bias [N] or None; residual [..., N] like the output or None; gelu: exact erf GELU
    before the residual. Returns [..., N] in x's dtype, written into ``out`` when given (it may be
    ``residual`` itself, never overlap x). Meant for M = prod(x.shape[:-1]) up to a beam step's 80 or so;
    rows go in blocks of 16 to 128 (``block_rows``), and each block reads the weight tiles again.
    ``pdl=False`` launches without programmatic dependent launch whatever the rows.

    A language model's decode step folds its RMSNorms, residual adds and SwiGLU into the products:
    ``norm=(square_sums, weight, eps, zero_centered)`` multiplies RMSNorm(x) instead of x, its rstd
    from ``square_sums`` [M, parts] float32 (the parts of each row's sum of squares, as a
    ``square_sums=True`` call returns them); ``swiglu``: x [..., 2K] holds the gate's columns, then
    the up projection's, and silu(gate) * up is multiplied; ``square_sums=True`` returns (out, the
    output rows' sums of squares per block of ``BLOCK_N`` columns [M, blocks]) for the next norm.
    ``one_wave``: ``linear_plan``'s one-wave split (a different sum order from the default plan).
    ``prefetch``: where the launch has PDL, each program asks L2 for its weight lines before waiting on
    the kernel ahead (for chains of small products that wait on latency, not bandwidth: a Whisper
    step; Qwen3-8B's bandwidth-bound step was slower with it). The result is unchanged.
    ``whole_k``: ``linear_plan``'s one K chunk a program (its own sum order); None: where the weight is
    small (``small_product``) and neither ``one_wave`` nor ``square_sums`` asks for the 64-column plans.
    """
    k = x.shape[-1] // 2 if swiglu else x.shape[-1]
    n = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != k or weight.stride(-1) != 1:
        raise ValueError(f"linear: weight {tuple(weight.shape)} does not match x {tuple(x.shape)} "
                         "or has a non-contiguous last dimension")
    if weight.dtype != x.dtype:
        raise ValueError(f"linear: weight dtype {weight.dtype} differs from x dtype {x.dtype}")
    out_shape = (*x.shape[:-1], n)
    if residual is not None and tuple(residual.shape) != out_shape:
        raise ValueError(f"linear: residual {tuple(residual.shape)} is not {out_shape}")
    x2 = _rows(x, "x")
    m = x2.shape[0]
    o = torch.empty(out_shape, device=x.device, dtype=x.dtype) if out is None else out
    if tuple(o.shape) != out_shape:
        raise ValueError(f"linear: out {tuple(o.shape)} is not {out_shape}")
    o2 = _rows(o, "out", writable=True)
    r2 = _rows(residual, "residual") if residual is not None else o2
    ss_in, norm_weight, eps, zero_centered = norm if norm is not None else (None, None, 0.0, False)
    if norm is not None and (ss_in.dim() != 2 or ss_in.shape[0] != m or ss_in.dtype != torch.float32
                             or not ss_in.is_contiguous() or norm_weight.shape != (k,)):
        raise ValueError(f"linear: norm needs square sums [{m}, parts] float32 (contiguous) and a weight [{k}]")
    n_sm = _sm_count(x.device)
    if whole_k is None:  # (a language model's folds keep the 64-column blocks their square sums count in)
        whole_k = not one_wave and not square_sums and small_product(n, k, x.element_size())
    plan = linear_plan(m, n, k, n_sm, x.element_size(), one_wave=one_wave, whole_k=whole_k)
    ss_out = torch.empty(m, plan["n_blocks"], device=x.device, dtype=torch.float32) if square_sums else None
    if m == 0:
        return (o, ss_out) if square_sums else o
    split = plan["programs_k"] > 1
    # one_wave launches that still spill into a second wave (more column blocks than programs an SM
    # allows: Qwen3-8B's gate/up) go without PDL, whose early programs would take the later waves' room
    fits = not one_wave or plan["n_blocks"] * plan["programs_k"] * plan["m_blocks"] <= PROGRAMS_PER_SM * n_sm
    ws = torch.empty(plan["splits"] * m * n if split else 1, device=x.device, dtype=torch.float32)
    locks = arrival_counters(x.device, plan["n_blocks"] * plan["m_blocks"]) if split else ws
    b = bias if bias is not None else o2
    flags = dict(HAS_BIAS=bias is not None, GELU=gelu, HAS_RES=residual is not None, NORM=norm is not None,
                 SS_BLOCK=triton.next_power_of_2(ss_in.shape[1]) if norm is not None else 1,
                 ZERO_CENTERED=bool(zero_centered), SWIGLU=swiglu, SS_OUT=square_sums)
    launch = pdl_options(x.device, m) if pdl and fits else {"PDL": False}
    if prefetch and launch["PDL"] and not settings.prefetch_disabled():
        line = 128 // weight.element_size()  # elements of a 128-byte line
        chunk = plan["group"] * plan["tiles"] * plan["block_k"]
        flags.update(PREFETCH_STEP=line, PREFETCH_LINES=triton.next_power_of_2(-(-chunk // line)))
    _linear_kernel[(plan["n_blocks"], plan["programs_k"], plan["m_blocks"])](
        x2, weight, b, r2, o2, ws, locks, m, n, k, x2.stride(0), weight.stride(0), r2.stride(0), o2.stride(0),
        ss_in if norm is not None else ws, ss_in.shape[1] if norm is not None else 1,
        norm_weight if norm is not None else ws, float(eps), ss_out if square_sums else ws,
        TILES=plan["tiles"], SPLITS=plan["splits"], GROUP=plan["group"], PROGRAMS_K=plan["programs_k"],
        BLOCK_M=plan["block_m"], BLOCK_N=plan["block_n"], BLOCK_K=plan["block_k"], FP32=x.dtype == torch.float32,
        num_warps=4, num_stages=plan["stages"], **flags,
        enable_fp_fusion=False,  # the epilogue's multiply-adds round alike in every program's layout
        **launch)
    return (o, ss_out) if square_sums else o


OP_MAX_ROWS = ROW_BLOCK  # rows up to which ``linear_op`` serves a caller: one row block


def op_can_run(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """``linear_op`` serves this product: Triton on CUDA, one half dtype, at most ``OP_MAX_ROWS`` rows."""
    return (kernels_can_run(x, x.dtype, interpreter=True) and weight.dtype == x.dtype and weight.dim() == 2
            and weight.stride(-1) == 1 and x.numel() // x.shape[-1] <= OP_MAX_ROWS)


@torch.library.custom_op("ostinato::skinny_linear", mutates_args=())
def linear_op(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None,
              square_sums: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None,
              eps: float = 0.0, zero_centered: bool = False, swiglu: bool = False,
              want_square_sums: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """``linear`` for a language model's decode step, as one opaque operator for its compiled caller
    (torch.compile would otherwise trace into the launcher's planning): (out, the output's square
    sums [M, blocks], or an empty tensor unless ``want_square_sums``); ``square_sums`` with
    ``norm_weight`` apply the RMSNorm on load. One-wave plans with PDL: Qwen3-8B's 36 layers of
    linears at one row on an H100 take 5.45 ms (cuBLAS 5.80 with the vocabulary projection)."""
    norm = (square_sums, norm_weight, eps, zero_centered) if norm_weight is not None else None
    got = linear(x, weight, residual=residual, norm=norm, swiglu=swiglu, square_sums=want_square_sums,
                 one_wave=True)
    return got if want_square_sums else (got, x.new_empty((0,), dtype=torch.float32))


@linear_op.register_fake
def _(x, weight, residual=None, square_sums=None, norm_weight=None, eps=0.0, zero_centered=False, swiglu=False,
      want_square_sums=False):
    rows = x.shape[:-1]
    blocks = -(-weight.shape[0] // BLOCK_N) if want_square_sums else 0
    ss = x.new_empty((math.prod(rows), blocks) if want_square_sums else (0,), dtype=torch.float32)
    return x.new_empty((*rows, weight.shape[0])), ss
