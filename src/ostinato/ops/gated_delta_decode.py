"""A Gated DeltaNet layer's decode step between its two products, in two launches: the causal
depthwise convolution over the rolling conv state (and the state's shift), then the gates, the
gated delta rule's update of the recurrent state and the gated output norm.

Between a Gated DeltaNet layer's input product and its output product, a decode step concatenated
the conv state with the new inputs, shifted the state, ran PyTorch's depthwise convolution and
SiLU, split and copied q, k, v, computed the write strength and decay, ran the delta step and the
gated RMSNorm: about twelve launches a layer (Qwen3.5-35B-A3B on an H100: ~17 us a layer of small
kernels, 30 layers). Here:

* ``_conv_kernel``: one program per (row, block of channels) reads each channel's K-1 remembered
  inputs and the new one, writes silu(conv) rounded to the dtype (as ``F.conv1d`` then ``F.silu``
  round), and shifts the channel's state in place (each channel belongs to one program);
* ``_delta_kernel``: one program per (row, value head, block of value columns) L2-normalises its
  key head's q and k, takes beta = sigmoid(b) (rounded to the dtype) and the log decay
  g = -exp(A_log) softplus(a + dt_bias) in float32 from the projection's raw outputs, and updates its
  state tile once (``ops.delta_rule.delta_update``, as the step kernel there does); the last of a
  head's blocks to finish (an arrival counter tells) applies the gated RMSNorm (per value head,
  times silu(z)) to the head's whole output, so the output product reads it directly.

Both kernels load their states (and the conv weights) before waiting for the kernel before them:
only they write the states, a step earlier, so that memory latency passes while the previous
kernel finishes. On an H100 the pair took 7.86 us a layer with the norm folded in, 6.81 with the
early loads (30 layers' states in one graph); the 35B-A3B step lost its 60 norm kernels.

The PyTorch path (``models.llm.layers.GatedDeltaNet.decode``) defines the numbers; these differ by
float rounding only. Only CUDA runs the kernels (``TRITON_INTERPRET=1`` runs them on the CPU for
tests); callers check ``can_run``.
"""
from __future__ import annotations

import torch

from .triton_support import HAVE_TRITON, arrival_counters, kernels_can_run, pdl_options, tl, triton

if HAVE_TRITON:
    from .delta_rule import delta_update
    from .triton_support import pdl_enter

CONV_BLOCK = 256  # channels a program
CONV_WARPS = 4
DELTA_WARPS = 4

if HAVE_TRITON:

    @triton.jit
    def _conv_kernel(x_ptr, state_ptr, w_ptr, out_ptr, C, sxm, ssb, ssc, som,
                     K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, channel block): out[b, c] = silu(sum_t w[c, t] window[c, t]) with window the
        K-1 remembered inputs then x[b, c]; the state then holds the last K-1 inputs."""
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < C
        t = tl.arange(0, BLOCK_T)
        kept = t < K - 1
        # the state and weights before the wait for the product: only this kernel writes the state
        cells = state_ptr + b * ssb + c[:, None] * ssc + t[None, :]
        old = tl.load(cells, mask=c_ok[:, None] & kept[None, :], other=0.0)
        w = tl.load(w_ptr + c[:, None] * K + t[None, :], mask=c_ok[:, None] & (t < K)[None, :], other=0.0)
        # the shifted state: cell t takes window[t + 1], read as a second load of the channel's cells
        nxt = tl.load(cells + 1, mask=c_ok[:, None] & (t < K - 2)[None, :], other=0.0)
        if PDL:
            pdl_enter()
        new = tl.load(x_ptr + b * sxm + c, mask=c_ok, other=0.0)
        window = tl.where((t == K - 1)[None, :], new[:, None], old)
        acc = tl.sum(window.to(tl.float32) * w.to(tl.float32), axis=1).to(new.dtype).to(tl.float32)
        out = (acc / (1.0 + tl.exp(-acc))).to(out_ptr.dtype.element_ty)
        shifted = tl.where((t == K - 2)[None, :], new[:, None], nxt)
        tl.debug_barrier()  # every thread has read its cells before any is overwritten
        tl.store(out_ptr + b * som + c, out, mask=c_ok)
        tl.store(cells, shifted.to(state_ptr.dtype.element_ty), mask=c_ok[:, None] & kept[None, :])

    @triton.jit
    def _delta_kernel(qkv_ptr, ba_ptr, alog_ptr, dtb_ptr, state_ptr, out_ptr, z_ptr, nw_ptr, normed_ptr, lock_ptr, eps,
                      s_qkv, s_ba, s_sb, s_sh, s_ob, s_oh, s_z, s_n,
                      KEY_DIM: tl.constexpr, V_HEADS: tl.constexpr, A_OFF: tl.constexpr, GROUP: tl.constexpr,
                      DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr, PDL: tl.constexpr):
        """Program (row * V_HEADS + head, value block): the gated delta step of one head's state tile
        [DK, BV], q/k/v from the conv output (q, k of key head head // GROUP), b at ba[head] and a at
        ba[A_OFF + head] (raw projection outputs); the last of a head's value blocks to arrive applies
        the gated RMSNorm to the head's whole output (z at z_ptr, weight nw) into ``normed``."""
        pid = tl.program_id(0)
        row = (pid // V_HEADS).to(tl.int64)
        head = pid % V_HEADS
        kh = head // GROUP
        dk = tl.arange(0, DK)
        dv = tl.program_id(1) * BV + tl.arange(0, BV)
        # the state tile before the wait for the conv: only this kernel writes it, a step ago
        tile = state_ptr + row * s_sb + head * s_sh + dk[:, None] * DV + dv[None, :]
        s = tl.load(tile)
        if PDL:
            pdl_enter()
        base = qkv_ptr + row * s_qkv
        q = tl.load(base + kh * DK + dk).to(tl.float32)
        k = tl.load(base + KEY_DIM + kh * DK + dk).to(tl.float32)
        v = tl.load(base + 2 * KEY_DIM + head * DV + dv).to(tl.float32)
        b = tl.load(ba_ptr + row * s_ba + head)
        beta = (1.0 / (1.0 + tl.exp(-b.to(tl.float32)))).to(b.dtype).to(tl.float32)
        a = tl.load(ba_ptr + row * s_ba + A_OFF + head).to(tl.float32)
        x = a + tl.load(dtb_ptr + head).to(tl.float32)
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's softplus, threshold 20
        decay = tl.exp(-tl.exp(tl.load(alog_ptr + head).to(tl.float32)) * softplus)
        out = delta_update(tile, s, q, k, v, decay, beta, SCALE)
        head_out = out_ptr + row * s_ob + head * s_oh
        tl.store(head_out + dv, out.to(out_ptr.dtype.element_ty))
        tl.debug_barrier()  # every thread's block stored before one thread's release of the count
        arrived = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == DV // BV - 1:
            _gated_norm(head_out, z_ptr + row * s_z + head * DV, nw_ptr, normed_ptr + row * s_n + head * DV, eps, DV)
            tl.atomic_xchg(lock_ptr + pid, 0)  # ready for the next launch (graph replays reuse the counters)

    @triton.jit
    def _gated_norm(x_ptr, z_ptr, w_ptr, out_ptr, eps, D: tl.constexpr):
        """out = RMSNorm(x) * silu(z) over D values, rounded as ``models.llm.fusion.gated_rms_norm``:
        the normalised x cast to the dtype and scaled by the weight (one rounding), then times the
        float32 silu(z) (one more)."""
        d = tl.arange(0, D)
        x = tl.load(x_ptr + d, cache_modifier=".cg")  # from L2: other programs wrote most of it
        h = x.to(tl.float32)
        h = h / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
        n = (h.to(x.dtype).to(tl.float32) * tl.load(w_ptr + d).to(tl.float32)).to(x.dtype).to(tl.float32)
        z = tl.load(z_ptr + d).to(tl.float32)
        tl.store(out_ptr + d, (n * (z / (1.0 + tl.exp(-z)))).to(out_ptr.dtype.element_ty))


def can_run(proj: torch.Tensor, rec_state: torch.Tensor) -> bool:
    """The kernels serve this layer: Triton on the device, a half dtype, a float32 state with
    power-of-two head sizes (value heads a multiple of 16 wide) laid out contiguously."""
    dk, dv = rec_state.shape[-2:]
    return (kernels_can_run(proj, proj.dtype, interpreter=True) and rec_state.dtype == torch.float32
            and dk & (dk - 1) == 0 and dv % 16 == 0 and rec_state.stride(-1) == 1 and rec_state.stride(-2) == dv)


def gated_delta_decode(proj: torch.Tensor, conv_state: torch.Tensor, rec_state: torch.Tensor,
                       conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                       norm_weight: torch.Tensor, eps: float, k_heads: int) -> torch.Tensor:
    """One decode step of a Gated DeltaNet layer from its input product ``proj`` [B, C + value_dim +
    2 * v_heads] (q, k, v channels (C = 2 * key_dim + value_dim), then z, then b, then a, as the fused
    projection lays them out): the conv state [>= B, C, K-1] and the recurrent state [>= B, v_heads,
    dk, dv] (float32) advance in place; returns the delta rule's output after the gated RMSNorm
    (``norm_weight`` [dv], ``eps``, gated by silu(z)) [B, value_dim] in proj's dtype, the output
    product's input. conv_weight [C, K] (or [C, 1, K]); a_log, dt_bias [v_heads]."""
    rows = proj.shape[0]
    v_heads, dk, dv = rec_state.shape[1:]
    channels, kernel = conv_state.shape[1], conv_state.shape[2] + 1
    value_dim = v_heads * dv
    key_dim = (channels - value_dim) // 2
    weight = conv_weight.reshape(channels, kernel)
    if proj.dim() != 2 or proj.shape[1] != channels + value_dim + 2 * v_heads or proj.stride(-1) != 1:
        raise ValueError(f"gated_delta_decode: proj {tuple(proj.shape)} does not fit {channels} channels and "
                         f"{v_heads} value heads of {dv}")
    if key_dim != k_heads * dk or v_heads % k_heads or conv_state.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("gated_delta_decode: the states do not fit the layer's heads")
    if norm_weight.shape != (dv,) or not norm_weight.is_contiguous():
        raise ValueError(f"gated_delta_decode: the norm weight {tuple(norm_weight.shape)} is not one of {dv}")
    conv_out = torch.empty(rows, channels, device=proj.device, dtype=proj.dtype)
    out = torch.empty(rows, v_heads, dv, device=proj.device, dtype=proj.dtype)
    normed = torch.empty(rows, value_dim, device=proj.device, dtype=proj.dtype)
    if rows == 0:
        return normed
    pdl = pdl_options(proj.device, rows)
    _conv_kernel[(rows, triton.cdiv(channels, CONV_BLOCK))](
        proj, conv_state, weight, conv_out, channels, proj.stride(0), conv_state.stride(0), conv_state.stride(1),
        conv_out.stride(0), K=kernel, BLOCK_T=triton.next_power_of_2(kernel), BLOCK_C=CONV_BLOCK,
        num_warps=CONV_WARPS, **pdl)
    z = proj[:, channels:]
    ba = proj[:, channels + value_dim:]
    block = 32 if dv % 32 == 0 else 16
    _delta_kernel[(rows * v_heads, dv // block)](
        conv_out, ba, a_log, dt_bias, rec_state, out, z, norm_weight, normed,
        arrival_counters(proj.device, rows * v_heads), float(eps), conv_out.stride(0), ba.stride(0),
        rec_state.stride(0), rec_state.stride(1), out.stride(0), out.stride(1), z.stride(0), normed.stride(0),
        KEY_DIM=key_dim, V_HEADS=v_heads, A_OFF=v_heads, GROUP=v_heads // k_heads, DK=dk, DV=dv, BV=block,
        SCALE=dk ** -0.5, num_warps=DELTA_WARPS, **pdl)
    return normed


@torch.library.custom_op("ostinato::gated_delta_decode", mutates_args=("conv_state", "rec_state"))
def gated_delta_decode_op(proj: torch.Tensor, conv_state: torch.Tensor, rec_state: torch.Tensor,
                          conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                          norm_weight: torch.Tensor, eps: float, k_heads: int) -> torch.Tensor:
    """``gated_delta_decode`` as one opaque operator for a compiled decode step; it advances both
    states in place."""
    return gated_delta_decode(proj, conv_state, rec_state, conv_weight, a_log, dt_bias, norm_weight, eps, k_heads)


@gated_delta_decode_op.register_fake
def _(proj, conv_state, rec_state, conv_weight, a_log, dt_bias, norm_weight, eps, k_heads):
    return proj.new_empty((proj.shape[0], rec_state.shape[1] * rec_state.shape[3]))
