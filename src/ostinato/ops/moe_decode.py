"""A routed mixture-of-experts block for a decode step of a few tokens, in three launches after the
router's product: routing, the chosen experts' gate/up products, and their down products summed
with the shared expert and the residual stream.

At batch 1, Qwen3.5-35B-A3B reads 8 of its 256 experts a layer (50 MB) and the step is bound by
memory, but PyTorch's path spent it in small kernels: top-k, sort, scatter and cumsum for the
grouped GEMM, then the GEMMs, SwiGLU, the weighting, the index_add and the shared expert's own
chain, about 25 launches a layer. Here:

* ``route``: one program per token takes the softmax of its router logits in float32, the top k
  (the larger probability first, the lower expert index on a tie) and renormalises them when asked;
  the weights are rounded to the model's dtype as the PyTorch path rounds them.
* ``experts_up``: one program per (token, expert slot, block of gate/up rows) streams that expert's
  rows once against the token's input, RMS-normalised on load from the square sums that the product
  before it returned (``skinny.linear``'s ``norm``), so no norm kernel runs.
* ``experts_down``: one program per (token, block of output columns) reads each chosen expert's down
  rows (and the shared expert's), applies SwiGLU to the gate/up halves on load, and adds the
  weighted outputs (the shared expert's by the sigmoid of its gate) to the residual stream in
  float32 with one rounding; it returns the sum's square sums per block for the next norm. The
  experts' loop is software-pipelined, so several experts' tiles are in flight, and the launch is
  one wave (256 programs at 2048 columns), so the next kernel's programs are already waiting when
  it ends. A program per (expert, block) with a last-arriver sum (2304 programs: several waves,
  which delay the next launch) made the 35B-A3B step slower (3472-3479 us against 3369-3382 for
  an unrolled loop and 3348-3360 for this one, one H100 process).

A routing fed NaN logits (an overflowed stream) still names experts that exist: a bad number
gives bad tokens, never an out-of-bounds read.

Products of one row are vector passes on the CUDA cores (a weight tile times the row, summed),
not tensor-core tiles padded to 16 rows: each expert's weights meet one token. Each expert's output
is rounded to the dtype before it is weighted, as ``F.linear`` rounds it in the PyTorch path; the
sum differs from that path's (expert-ordered bfloat16 adds) by float rounding only.

Only CUDA runs the kernels (``TRITON_INTERPRET=1`` runs them on the CPU for tests); callers check
``can_run`` and otherwise use PyTorch's ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from .triton_support import HAVE_TRITON, kernels_can_run, pdl_options, tl, triton

if HAVE_TRITON:
    from .triton_support import pdl_enter, swiglu_rounded

# Launch shapes tuned on an H100 with Qwen3.5-35B-A3B's step at one row (the whole step's replay, 40
# layers): gate/up 16 rows x 256 a tile over 2 warps (512 programs a token) 3777 us against 4246 for
# 32 x 128 over 4; 8-64 rows, 128-512 wide tiles, 2-8 warps, 2-4 stages were within 2% of it or
# slower. down 8 columns a program over 4 warps, 3 experts' tiles in flight (256 programs a token):
# 3348-3360 us; 2 or 4 stages 3446-3462, 2 warps 3388, 16 columns 3408-3512, 32 columns 3694;
# routing on one warp (shuffles only) 50 us a step faster than on four.
UP_BLOCK_N = 16  # gate/up rows a program
UP_BLOCK_K = 256
UP_STAGES = 3
UP_WARPS = 2
DOWN_BLOCK_N = 8  # output columns a program
DOWN_WARPS = 4
DOWN_STAGES = 3  # the experts' down tiles in flight per program
ROUTE_WARPS = 1
SS_COLS = 8  # output columns a square-sum part covers (the next norm sums the parts)
MAX_TOKENS = 16  # tokens a call serves (a decode step's rows)

if HAVE_TRITON:

    @triton.jit
    def _route_kernel(logits_ptr, sl, ids_ptr, wts_ptr, E: tl.constexpr, BLOCK_E: tl.constexpr,
                      TOPK: tl.constexpr, BLOCK_TOPK: tl.constexpr, NORMALIZE: tl.constexpr,
                      DTYPE: tl.constexpr, PDL: tl.constexpr):
        """Program t: softmax of token t's E logits (float32), the TOPK largest (lower index on a tie),
        renormalised with NORMALIZE, rounded to DTYPE; ids [t, TOPK] int32, weights float32."""
        if PDL:
            pdl_enter()
        t = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        ok = e < E
        z = tl.load(logits_ptr + t * sl + e, mask=ok, other=float("-inf")).to(tl.float32)
        p = tl.exp(z - tl.max(z, axis=0))
        p = p / tl.sum(p, axis=0)
        p = tl.where(ok & (p == p), p, -1.0)  # NaN logits (an overflowed stream) never pick an expert past E
        slot = tl.arange(0, BLOCK_TOPK)
        ids = tl.zeros([BLOCK_TOPK], tl.int32)
        wts = tl.zeros([BLOCK_TOPK], tl.float32)
        for j in tl.static_range(TOPK):
            best = tl.max(p, axis=0)
            index = tl.minimum(tl.min(tl.where(p == best, e, BLOCK_E), axis=0), E - 1)  # in range, whatever p holds
            ids = tl.where(slot == j, index, ids)
            wts = tl.where(slot == j, best, wts)
            p = tl.where(e == index, -1.0, p)
        if NORMALIZE:
            wts = wts / tl.sum(wts, axis=0)
        wts = wts.to(DTYPE).to(tl.float32)
        tl.store(ids_ptr + t * TOPK + slot, ids, mask=slot < TOPK)
        tl.store(wts_ptr + t * TOPK + slot, wts, mask=slot < TOPK)

    @triton.jit
    def _experts_up_kernel(x_ptr, ids_ptr, w_ptr, h_ptr, ss_ptr, ss_parts, nw_ptr, eps, sxm, swe, swn, shm, N, K,
                           TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
                           NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, SS_BLOCK: tl.constexpr,
                           NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
        """Program (column block, pair p = t * TOPK + j): h[p, cols] = W[ids[p], cols] @ x'[t], x' the
        RMSNorm of x[t] with NORM (rstd from its ss_parts square sums), rounded to the dtype."""
        if PDL:
            pdl_enter()
        pid_n = tl.program_id(0)
        p = tl.program_id(1).to(tl.int64)
        t = p // TOPK
        expert = tl.load(ids_ptr + p).to(tl.int64)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w_rows = w_ptr + expert * swe + cols.to(tl.int64)[:, None] * swn
        x_row = x_ptr + t * sxm
        rstd = 0.0
        if NORM:
            parts = tl.arange(0, SS_BLOCK)
            sums = tl.load(ss_ptr + t * ss_parts + parts, mask=parts < ss_parts, other=0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(sums, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.range(0, TILES, num_stages=NUM_STAGES):
            k = i * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = k < K
            x = tl.load(x_row + k, mask=k_ok, other=0.0)
            if NORM:  # as models.llm.fusion.rms_norm rounds it
                h = x.to(tl.float32) * rstd
                nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
                if ZERO_CENTERED:
                    x = (h * (1.0 + nw)).to(x.dtype)
                else:
                    x = (h.to(x.dtype).to(tl.float32) * nw).to(x.dtype)
            wt = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.sum(wt.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(h_ptr + p * shm + cols, acc.to(h_ptr.dtype.element_ty), mask=col_ok)

    @triton.jit
    def _swiglu_product(h_row, wt, i, i_ok, I):
        """The weight tile wt [columns, inner] @ (silu(gate) * up) for one expert's gate/up halves
        h_row[:I], h_row[I:2I], each op rounded to the dtype as ``fusion.swiglu`` rounds it; the
        product rounded as F.linear's."""
        g = tl.load(h_row + i, mask=i_ok, other=0.0)
        act = swiglu_rounded(g, tl.load(h_row + I + i, mask=i_ok, other=0.0))
        y = tl.sum(wt.to(tl.float32) * act.to(tl.float32)[None, :], axis=1)
        return y.to(g.dtype).to(tl.float32)

    @triton.jit
    def _experts_down_kernel(h_ptr, ids_ptr, wts_ptr, w_ptr, sh_ptr, sg_ptr, sw_ptr, r_ptr, o_ptr, sso_ptr,
                             shm, swe, swn, ssm, ssw, srm, som, N, I, IS,
                             TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_I: tl.constexpr, BLOCK_IS: tl.constexpr, SS_COLS: tl.constexpr,
                             NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
        """Program (column block, token t): out[t, cols] = r[t] + sum_j wts[t, j] * W[ids[t, j]] @
        swiglu(h[t * TOPK + j]) (+ sigmoid(sg[t]) * Ws @ swiglu(sh[t]) with HAS_SHARED, inner size IS),
        float32, one rounding; sso[t, part] = the sum of squares of the rounded outputs in each
        SS_COLS columns (a part for every SS_COLS of N, whatever BLOCK_N). The experts' loop is
        software-pipelined (their tiles in flight NUM_STAGES deep); the shared expert's tile is loaded
        before the wait for the kernel before (weights are never its output)."""
        pid_n = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        rows = cols.to(tl.int64)[:, None]
        js = tl.arange(0, BLOCK_IS)
        js_ok = js < IS
        if HAS_SHARED:
            shared_tile = tl.load(sw_ptr + rows * ssw + js[None, :], mask=col_ok[:, None] & js_ok[None, :], other=0.0)
        if PDL:
            pdl_enter()
        i = tl.arange(0, BLOCK_I)
        i_ok = i < I
        acc = tl.zeros([BLOCK_N], tl.float32)
        for j in tl.range(0, TOPK, num_stages=NUM_STAGES):
            p = t * TOPK + j
            expert = tl.load(ids_ptr + p).to(tl.int64)
            weight = tl.load(wts_ptr + p)
            wt = tl.load(w_ptr + expert * swe + rows * swn + i[None, :], mask=col_ok[:, None] & i_ok[None, :], other=0.0)
            acc += weight * _swiglu_product(h_ptr + p * shm, wt, i, i_ok, I)
        if HAS_SHARED:
            gate = tl.load(sg_ptr + t * ssm).to(tl.float32)
            gate = (1.0 / (1.0 + tl.exp(-gate))).to(sg_ptr.dtype.element_ty).to(tl.float32)
            y = _swiglu_product(sh_ptr + t * ssm, shared_tile, js, js_ok, IS)
            acc += (gate * y).to(sg_ptr.dtype.element_ty).to(tl.float32)
        acc += tl.load(r_ptr + t * srm + cols, mask=col_ok, other=0.0).to(tl.float32)
        out = acc.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + t * som + cols, out, mask=col_ok)
        of = tl.where(col_ok, out.to(tl.float32), 0.0)
        parts = tl.sum(tl.reshape(of * of, [BLOCK_N // SS_COLS, SS_COLS]), axis=1)
        part = pid_n * (BLOCK_N // SS_COLS) + tl.arange(0, BLOCK_N // SS_COLS)
        n_parts = tl.cdiv(N, SS_COLS)
        tl.store(sso_ptr + t * n_parts + part, parts, mask=part < n_parts)


def can_run(x: torch.Tensor, experts_gate_up: torch.Tensor, experts_down: torch.Tensor) -> bool:
    """The kernels serve these: Triton on x's device, one half dtype, at most ``MAX_TOKENS`` tokens,
    expert weights with contiguous rows."""
    return (kernels_can_run(x, x.dtype, interpreter=True) and experts_gate_up.dtype == x.dtype
            and experts_down.dtype == x.dtype and experts_gate_up.stride(-1) == 1 and experts_down.stride(-1) == 1
            and x.numel() // x.shape[-1] <= MAX_TOKENS)


def route(logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype):
    """(ids [T, top_k] int32, weights [T, top_k] float32 holding ``dtype`` values) from router
    logits [T, E] (a contiguous last dimension)."""
    tokens, experts = logits.shape
    ids = torch.empty(tokens, top_k, device=logits.device, dtype=torch.int32)
    weights = torch.empty(tokens, top_k, device=logits.device, dtype=torch.float32)
    if tokens:
        _route_kernel[(tokens,)](logits, logits.stride(0), ids, weights, E=experts,
                                 BLOCK_E=triton.next_power_of_2(experts), TOPK=top_k,
                                 BLOCK_TOPK=triton.next_power_of_2(top_k), NORMALIZE=normalize,
                                 DTYPE=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16,
                                 num_warps=ROUTE_WARPS, **pdl_options(logits.device, tokens))
    return ids, weights


def experts_up(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, norm: Optional[tuple] = None):
    """h [T * top_k, 2I]: each token's chosen experts' gate/up products. x [T, H]; ids [T, top_k]
    int32; gate_up [E, 2I, H]; ``norm=(square_sums [T, parts] float32, weight [H], eps,
    zero_centered)`` applies the RMSNorm to x on load."""
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    n = gate_up.shape[1]
    h = torch.empty(tokens * top_k, n, device=x.device, dtype=x.dtype)
    if not tokens:
        return h
    ss, norm_weight, eps, zero_centered = norm if norm is not None else (h, h, 0.0, False)
    _experts_up_kernel[(triton.cdiv(n, UP_BLOCK_N), tokens * top_k)](
        x, ids, gate_up, h, ss, ss.shape[1] if norm is not None else 1, norm_weight, float(eps),
        x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0), n, hidden,
        TOPK=top_k, BLOCK_N=UP_BLOCK_N, BLOCK_K=UP_BLOCK_K, TILES=triton.cdiv(hidden, UP_BLOCK_K),
        NORM=norm is not None, ZERO_CENTERED=bool(zero_centered),
        SS_BLOCK=triton.next_power_of_2(ss.shape[1]) if norm is not None else 1, NUM_STAGES=UP_STAGES,
        num_warps=UP_WARPS, **pdl_options(x.device, tokens))
    return h


def experts_down(h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, down: torch.Tensor,
                 residual: torch.Tensor, shared: Optional[tuple] = None):
    """(residual + the weighted experts' outputs (+ the shared expert's), its square sums [T, parts]
    (a part a ``SS_COLS`` columns)).
    h [T * top_k, 2I] from ``experts_up``; down [E, H, I]; residual [T, H];
    ``shared=(gate_up [T, 2Is] view, gate logit [T] view with the same row stride, down weight [H, Is])``."""
    tokens, hidden = residual.shape
    top_k = ids.shape[1]
    inner = down.shape[2]
    out = torch.empty_like(residual)
    blocks = triton.cdiv(hidden, DOWN_BLOCK_N)
    ss = torch.empty(tokens, triton.cdiv(hidden, SS_COLS), device=h.device, dtype=torch.float32)
    if not tokens:
        return out, ss
    s_h, s_gate, s_down = shared if shared is not None else (h, h, down)
    _experts_down_kernel[(blocks, tokens)](
        h, ids, weights, down, s_h, s_gate, s_down, residual, out, ss,
        h.stride(0), down.stride(0), down.stride(1), s_h.stride(0), s_down.stride(0) if shared is not None else 0,
        residual.stride(0), out.stride(0), hidden, inner, s_down.shape[1],
        TOPK=top_k, HAS_SHARED=shared is not None, BLOCK_N=DOWN_BLOCK_N, BLOCK_I=triton.next_power_of_2(inner),
        BLOCK_IS=triton.next_power_of_2(s_down.shape[1]), SS_COLS=SS_COLS, NUM_STAGES=DOWN_STAGES,
        num_warps=DOWN_WARPS, **pdl_options(h.device, tokens))
    return out, ss


@torch.library.custom_op("ostinato::moe_decode", mutates_args=())
def moe_decode_op(x: torch.Tensor, router_out: torch.Tensor, experts: int, top_k: int, normalize: bool,
                  gate_up: torch.Tensor, down: torch.Tensor, shared_down: Optional[torch.Tensor],
                  square_sums: Optional[torch.Tensor], norm_weight: Optional[torch.Tensor], eps: float,
                  zero_centered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A MoE block's decode step as one opaque operator for a compiled caller: (x + the block's
    output, its square sums). ``router_out`` [T, S + E (+ 1)]: with ``shared_down`` the shared
    expert's gate/up columns first (S = 2I), then the E router logits, then the shared expert's gate
    logit; else the E logits alone. ``square_sums``/``norm_weight`` apply the block's RMSNorm to x."""
    shared = None
    start = 0
    if shared_down is not None:
        start = shared_down.shape[1] * 2
        shared = (router_out[:, :start], router_out[:, start + experts], shared_down)
    ids, weights = route(router_out[:, start:start + experts], top_k, normalize, x.dtype)
    norm = (square_sums, norm_weight, eps, zero_centered) if norm_weight is not None else None
    h = experts_up(x, ids, gate_up, norm)
    return experts_down(h, ids, weights, down, x, shared)


@moe_decode_op.register_fake
def _(x, router_out, experts, top_k, normalize, gate_up, down, shared_down, square_sums, norm_weight, eps,
      zero_centered):
    return torch.empty_like(x), x.new_empty((x.shape[0], -(-x.shape[1] // SS_COLS)), dtype=torch.float32)
