"""The layers of the decoder-only family: RMSNorm, rotary embeddings, attention with a static KV
cache, Gated DeltaNet with its conv and recurrent state, the SwiGLU MLP and the routed MoE.

Every layer has two entry points that share its weights and its state buffers:
``prefill(x [G, T, H], rows, start, ...)`` runs a chunk of T prompt tokens for G rows (the rows'
indices into the state), and ``decode(x [B, H], ...)`` runs one token for each of the state's first
B rows with graph-safe ops only (no host sync, fixed shapes). Parameter names follow the Hugging
Face checkpoints, so loading is a rename at most.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ops import decode_attention as decode_kernels
from ...ops import delta_rule as delta_kernel
from ...ops import causal_conv, gated_delta_decode, moe_combine, moe_decode, rotary_cache, skinny
from ...ops.attention import attention
from .config import LLMConfig
from . import fusion
from .delta_rule import chunked_delta_rule, recurrent_delta_step

DELTA_RULE_TOKENS = 2048  # rows x tokens per chunked delta-rule call in prefill


def project(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, decode: bool = False) -> Tensor:
    """x @ weight^T (+ bias). In a decode step of few rows on CUDA in half precision, ostinato's
    skinny kernel (each weight tile streamed once, K split so that every SM reads: the projections
    of a Qwen3-8B step at one row on an H100 take 5.45 ms, against cuBLAS's 5.80); F.linear
    everywhere else."""
    if decode and bias is None and skinny.op_can_run(x, weight):
        return skinny.linear_op(x, weight)[0]
    return F.linear(x, weight, bias)


class StepPlaces(NamedTuple):
    """Where a decode step's token of each row goes, worked out once a step for every layer:
    ``positions`` [B], ``lengths`` = positions + 1 (the keys each row attends to), the rotary ``cos``
    and ``sin`` [B, R/2] and the ``inv_freq`` [R/2] they come from (the q/k kernel computes its own
    from these), and ``visible`` [B, L] marking the cache entries each row attends to (for the plain
    attention path; None in a model without attention layers)."""
    positions: Tensor
    lengths: Tensor
    cos: Tensor
    sin: Tensor
    inv_freq: Tensor
    visible: Optional[Tensor]


class Normed(NamedTuple):
    """A decode step's residual stream ``x`` on its way into a projection through ``norm``. With the
    float32 square sums of its rows (``square_sums`` [B, parts], from the product that wrote x) the
    skinny kernel applies the norm as it loads x, and no norm kernel runs; without, the norm runs
    first (``tensor``)."""
    x: Tensor
    square_sums: Optional[Tensor]
    norm: "RMSNorm"

    def tensor(self) -> Tensor:
        return self.norm(self.x)


def project_normed(inp: Normed, weight: Tensor) -> Tensor:
    """RMSNorm(x) @ weight^T in a decode step."""
    if inp.square_sums is not None and skinny.op_can_run(inp.x, weight):
        norm = inp.norm
        return skinny.linear_op(inp.x, weight, None, inp.square_sums, norm.weight, norm.eps, norm.zero_centered)[0]
    return project(inp.tensor(), weight, decode=True)


def project_residual(h: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Tensor, swiglu: bool = False):
    """(residual + act(h) @ weight^T, the sum's square sums or None) in a decode step: one skinny
    product where it runs (act: silu(gate) * up of h's halves with ``swiglu``, else none)."""
    if bias is None and skinny.op_can_run(h, weight):
        return skinny.linear_op(h, weight, residual, None, None, 0.0, False, swiglu, True)
    if swiglu:
        h = fusion.swiglu(h)
    return residual + project(h, weight, bias, decode=True), None


def fuse_linears(*linears: nn.Linear) -> Optional[Tensor]:
    """One weight for projections of the same input (one GEMM instead of several per step): their
    weights become views of it, so the model still holds one copy. None when any has a bias."""
    if any(layer.bias is not None for layer in linears):
        return None
    fused = torch.cat([layer.weight.detach() for layer in linears])
    offset = 0
    for layer in linears:
        rows = layer.weight.shape[0]
        layer.weight = nn.Parameter(fused[offset:offset + rows], requires_grad=False)
        offset += rows
    return fused


class RMSNorm(nn.Module):
    """Llama/Qwen3 scale the normalised input cast back to its dtype; Qwen3-Next and Qwen3.5 store the
    weight as an offset from one and scale in float32 before the cast."""

    def __init__(self, dim: int, eps: float, zero_centered: bool):
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return fusion.rms_norm(x, self.weight, self.eps, self.zero_centered)

    def after_add(self, x: Tensor, update: Tensor):
        """(x + update, the norm of that sum)."""
        return fusion.add_rms_norm(x, update, self.weight, self.eps, self.zero_centered)


class GatedRMSNorm(nn.Module):
    """Gated DeltaNet's output norm: RMSNorm per value head, then times silu(z)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        return fusion.gated_rms_norm(x, z, self.weight, self.eps)


def rotary_tables(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype):
    """cos and sin for ``positions`` (any shape), computed in float32 and cast as the reference does."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, config: LLMConfig):
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.gated = c.gated_attention
        q_out = c.num_heads * c.head_dim * (2 if self.gated else 1)
        self.q_proj = nn.Linear(c.hidden_size, q_out, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.zero_centered_norm)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.zero_centered_norm)
        else:
            self.q_norm = self.k_norm = None
        self.scale = c.head_dim ** -0.5
        self.fused = None

    def fuse(self) -> None:
        self.fused = fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def _project(self, x, cos: Tensor, sin: Tensor):
        """q, k, v as [..., heads, head_dim] (rotated, normed), and the output gate or None; x a
        tensor (prefill) or a decode step's ``Normed`` stream."""
        if isinstance(x, Normed) and self.fused is None:
            x = x.tensor()
        lead = x.x.shape[:-1] if isinstance(x, Normed) else x.shape[:-1]
        if self.fused is not None:
            mixed = project_normed(x, self.fused) if isinstance(x, Normed) else F.linear(x, self.fused)
            q, k, v = mixed.split([self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features],
                                  dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        gate = None
        if self.gated:  # per head: the query, then its gate
            q, gate = q.reshape(*lead, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(*lead, self.heads * self.head_dim)
        q = q.reshape(*lead, self.heads, self.head_dim)
        k = k.reshape(*lead, self.kv_heads, self.head_dim)
        v = v.reshape(*lead, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
        return fusion.rotate(q, cos, sin), fusion.rotate(k, cos, sin), v, gate

    def _finish(self, out: Tensor, gate: Optional[Tensor], residual: Optional[Tensor] = None):
        """The output projection; in a decode step (``residual`` given) added to the residual stream:
        (new stream, its square sums or None)."""
        if gate is not None:
            out = out * torch.sigmoid(gate)
        if residual is not None:
            return project_residual(out, self.o_proj.weight, self.o_proj.bias, residual)
        return self.o_proj(out)

    def prefill(self, x: Tensor, cos: Tensor, sin: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor,
                start: int) -> Tensor:
        """x [G, T, H]: tokens start..start+T-1 of rows ``rows``; attends to the cache plus the chunk."""
        g, t, _ = x.shape
        q, k, v, gate = self._project(x, cos, sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        cache_k[rows, :, start:start + t] = k
        cache_v[rows, :, start:start + t] = v
        gqa = self.heads != self.kv_heads
        if start == 0:  # the whole prompt so far is this chunk: plain causal attention (flash kernels)
            out = attention(q.transpose(1, 2), k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        else:
            keys, values = cache_k[rows, :, :start + t], cache_v[rows, :, :start + t]
            causal = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(start)
            out = attention(q.transpose(1, 2), keys, values, attn_mask=causal, scale=self.scale,
                            enable_gqa=gqa)
        return self._finish(out.transpose(1, 2).reshape(g, t, -1), gate)

    def decode(self, x: Normed, places: StepPlaces, cache_k: Tensor, cache_v: Tensor):
        """x: the stream [B, H] into the layer's input norm, one token per row at ``places``. The cache
        is the first B rows' views. Returns the stream after the attention block and its square sums
        (or None)."""
        b = x.x.shape[0]
        if self.fused is not None and rotary_cache.can_run(x.x, cache_k):
            q, gate = self._project_into_cache(x, places, cache_k, cache_v)
        else:
            q, k, v, gate = self._project(x, places.cos, places.sin)
            rows = torch.arange(b, device=q.device)
            cache_k[rows, :, places.positions] = k
            cache_v[rows, :, places.positions] = v
        if decode_kernels.gqa_can_run(q, cache_k):  # one kernel reads each key once, up to the row's length
            out = decode_kernels.gqa_decode_attention_op(q, cache_k, cache_v, places.lengths, self.scale)
            return self._finish(out.reshape(b, self.heads * self.head_dim), gate, x.x)
        group = self.heads // self.kv_heads
        # [B, kv, group, d] @ [B, kv, d, L]: each key and value row is read once for its query group
        scores = torch.matmul(q.view(b, self.kv_heads, group, self.head_dim), cache_k.transpose(-1, -2))
        scores = (scores * self.scale).masked_fill(~places.visible[:, None, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, cache_v).reshape(b, self.heads * self.head_dim)
        return self._finish(out, gate, x.x)

    def _project_into_cache(self, x: Normed, places: StepPlaces, cache_k: Tensor, cache_v: Tensor):
        """A decode step's fused projection, then one kernel for the q/k norms, the rotary embedding
        and the cache writes: (q [B, heads, D], the output gate or None)."""
        mixed = project_normed(x, self.fused)
        norm = self.q_norm
        q = rotary_cache.qk_rotary_cache_op(
            mixed, places.inv_freq, cache_k, cache_v, places.positions, self.heads, self.gated,
            None if norm is None else norm.weight, None if norm is None else self.k_norm.weight,
            0.0 if norm is None else norm.eps, norm is not None and norm.zero_centered)
        gate = None
        if self.gated:  # per head: the query, then its gate
            b = mixed.shape[0]
            gate = mixed[:, :2 * self.heads * self.head_dim].reshape(b, self.heads, 2 * self.head_dim)
            gate = gate[..., self.head_dim:].reshape(b, self.heads * self.head_dim)
        return q, gate


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear-attention layer (Qwen3-Next's fused projections are split to this layout on load)."""

    def __init__(self, config: LLMConfig):
        super().__init__()
        c = config
        self.k_heads, self.v_heads = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim, self.value_dim = self.k_heads * self.dk, self.v_heads * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = c.linear_conv_kernel
        self.in_proj_qkv = nn.Linear(c.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, self.v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, c.hidden_size, bias=False)
        self.fused = None

    def fuse(self) -> None:
        self.fused = fuse_linears(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)

    def _project(self, x):
        """(qkv before the conv, z, b, a): one GEMM once fused; x a tensor or a decode step's ``Normed``."""
        if self.fused is None:
            x = x.tensor() if isinstance(x, Normed) else x
            return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        mixed = project_normed(x, self.fused) if isinstance(x, Normed) else F.linear(x, self.fused)
        return mixed.split([self.conv_dim, self.value_dim, self.v_heads, self.v_heads], dim=-1)

    def _split(self, mixed: Tensor, a: Tensor, b: Tensor, repeat: bool = True):
        lead = mixed.shape[:-1]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(*lead, self.k_heads, self.dk)
        k = k.reshape(*lead, self.k_heads, self.dk)
        v = v.reshape(*lead, self.v_heads, self.dv)
        if repeat and self.v_heads != self.k_heads:
            q = q.repeat_interleave(self.v_heads // self.k_heads, dim=-2)
            k = k.repeat_interleave(self.v_heads // self.k_heads, dim=-2)
        beta, g = fusion.delta_gates(b, a, self.A_log, self.dt_bias)
        return q, k, v, g, beta

    def _finish(self, out: Tensor, z: Tensor, residual: Optional[Tensor] = None):
        """The gated norm and output projection; in a decode step (``residual`` given) added to the
        stream: (new stream, its square sums or None)."""
        lead = out.shape[:-2]
        out = self.norm(out, z.reshape(*lead, self.v_heads, self.dv)).reshape(*lead, self.value_dim)
        if residual is not None:
            return project_residual(out, self.out_proj.weight, None, residual)
        return self.out_proj(out)

    def prefill(self, x: Tensor, conv_state: Tensor, rec_state: Tensor, rows: Tensor) -> Tensor:
        g_rows, t, _ = x.shape
        mixed, z, b, a = self._project(x)
        weight = self.conv1d.weight
        held = conv_state[rows].to(mixed.dtype)  # the last K-1 inputs of each row before this chunk
        if causal_conv.can_run(mixed, conv_state, weight):
            conv_out = causal_conv.causal_conv(mixed, conv_state, rows, weight)
        else:
            window = torch.cat((held, mixed.transpose(1, 2)), dim=-1)  # [G, C, K-1+T]
            conv_out = F.silu(F.conv1d(window.to(weight.dtype), weight, groups=self.conv_dim)).to(x.dtype)
            conv_out = conv_out.transpose(1, 2)
        keep = self.kernel - 1
        conv_state[rows] = torch.cat((held, mixed[:, -keep:].transpose(1, 2)), dim=-1)[..., -keep:].to(conv_state.dtype)
        q, k, v, g, beta = self._split(conv_out, a, b, repeat=False)  # the rule serves groups itself
        # a few rows at a time: the rule's float32 temporaries grow with rows x tokens
        step = max(1, DELTA_RULE_TOKENS // t)
        outs = []
        for i in range(0, g_rows, step):
            part = slice(i, i + step)
            out, final = chunked_delta_rule(q[part], k[part], v[part], g[part], beta[part], rec_state[rows[part]])
            rec_state[rows[part]] = final
            outs.append(out)
        return self._finish(torch.cat(outs) if len(outs) > 1 else outs[0], z)

    def decode(self, x: Normed, conv_state: Tensor, rec_state: Tensor):
        """One token per row from the stream ``x``: (the stream after this block, its square sums or None).
        Where the kernels run, the conv, gates, delta rule and gated norm between the two products
        take two launches (``ops.gated_delta_decode``)."""
        if self.fused is not None and gated_delta_decode.can_run(x.x, rec_state):
            proj = project_normed(x, self.fused)
            normed = gated_delta_decode.gated_delta_decode_op(proj, conv_state, rec_state, self.conv1d.weight,
                                                              self.A_log, self.dt_bias, self.norm.weight,
                                                              self.norm.eps, self.k_heads)
            return project_residual(normed, self.out_proj.weight, None, x.x)
        mixed, z, b, a = self._project(x)
        mixed = mixed[:, :, None]  # [B, C, 1]
        window = torch.cat((conv_state.to(mixed.dtype), mixed), dim=-1)
        conv_state.copy_(window[..., 1:])
        weight = self.conv1d.weight
        mixed = F.silu(F.conv1d(window.to(weight.dtype), weight, groups=self.conv_dim)).to(x.x.dtype)[..., 0]
        fused = delta_kernel.can_run(rec_state, self.dk, self.dv)
        q, k, v, g, beta = self._split(mixed, a, b, repeat=not fused)
        if fused:
            out = delta_kernel.delta_step(q, k, v, g, beta, rec_state)
        else:
            out = recurrent_delta_step(q, k, v, g, beta, rec_state)
        return self._finish(out, z, x.x)


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.fused = None

    def fuse(self) -> None:
        self.fused = fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: Tensor, decode: bool = False) -> Tensor:
        if self.fused is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        inner = fusion.swiglu(project(x, self.fused, decode=decode))
        return project(inner, self.down_proj.weight, self.down_proj.bias, decode)

    def decode(self, x: Normed):
        """x.x + MLP(norm(x.x)) for a decode step: (the stream, its square sums or None); the norm,
        SwiGLU and residual add ride in the skinny products where they run."""
        if self.fused is None:
            return x.x + self(x.tensor()), None
        gate_up = project_normed(x, self.fused)
        return project_residual(gate_up, self.down_proj.weight, self.down_proj.bias, x.x, swiglu=True)


def grouped_mm_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's grouped GEMM runs here (CUDA, Hopper or newer, bfloat16) on the experts'
    stacked layout: tried once on a small problem of that layout, since support varies by build."""
    if device.type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return False
    if torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        weights = torch.randn(4, 64, 32, device=device, dtype=dtype)  # [E, out, in]
        x = torch.randn(8, 32, device=device, dtype=dtype)
        offsets = torch.tensor([2, 2, 5, 8], dtype=torch.int32, device=device)
        got = torch._grouped_mm(x, weights.transpose(-1, -2), offs=offsets)
        want = torch.cat([x[0:2] @ weights[0].t(), x[2:5] @ weights[2].t(), x[5:8] @ weights[3].t()])
        return bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, TypeError, NotImplementedError):
        return False


class MoE(nn.Module):
    """Top-k routed experts (softmax, then the top k, renormalised when configured), plus Qwen3-Next
    and Qwen3.5's shared expert scaled by its sigmoid gate. Experts are stored stacked:
    gate_up [E, 2I, H] (gate rows first) and down [E, H, I]."""

    def __init__(self, config: LLMConfig):
        super().__init__()
        c = config
        self.experts, self.top_k, self.normalize = c.num_experts, c.experts_per_token, c.norm_topk_prob
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size))
        self.experts_down = nn.Parameter(torch.empty(c.num_experts, c.hidden_size, c.moe_intermediate_size))
        if c.shared_expert:
            self.shared_expert = MLP(c.hidden_size, c.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(c.hidden_size, 1, bias=False)
        else:
            self.shared_expert = None
        self.grouped = False  # set by the model once it knows its device and dtype
        self.router_in = None

    def fuse(self) -> None:
        """One weight for the products of the block's input: the shared expert's gate/up rows (its
        fused weight becomes a view of them), the router, the shared expert's gate."""
        if self.shared_expert is None:
            self.router_in = self.gate.weight
            return
        mlp = self.shared_expert
        self.router_in = fuse_linears(mlp.gate_proj, mlp.up_proj, self.gate, self.shared_expert_gate)
        if self.router_in is not None:
            mlp.fused = self.router_in[: 2 * mlp.gate_proj.out_features]
        else:
            mlp.fuse()

    def decode(self, x: Normed):
        """x.x + MoE(norm(x.x)) for a decode step: (the stream, its square sums or None). Where the
        kernels run, one skinny product gives the shared expert's gate/up, the router logits and the
        shared gate from the normed stream, and ``ops.moe_decode`` routes, runs the chosen experts
        and adds everything to the stream in three more launches."""
        if (self.router_in is not None and x.square_sums is not None and skinny.op_can_run(x.x, self.router_in)
                and moe_decode.can_run(x.x, self.experts_gate_up, self.experts_down)):
            router_out = project_normed(x, self.router_in)
            norm = x.norm
            shared = self.shared_expert.down_proj.weight if self.shared_expert is not None else None
            return moe_decode.moe_decode_op(x.x, router_out, self.experts, self.top_k, self.normalize,
                                            self.experts_gate_up, self.experts_down, shared, x.square_sums,
                                            norm.weight, norm.eps, norm.zero_centered)
        return x.x + self(x.tensor(), True), None

    def route(self, x: Tensor):
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: Tensor, graph_safe: bool) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = self.route(x)
        if self.grouped:
            out = self._grouped(x, weights, chosen)
        elif graph_safe:
            out = self._gathered(x, weights, chosen)
        else:
            out = self._per_expert(x, weights, chosen)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, decode=graph_safe)
        return out.reshape(shape)

    def _per_expert(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """Each expert over the tokens routed to it (host-side indexing: eager prefill on any device)."""
        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():
            token, slot = torch.where(chosen == expert)
            gate, up = F.linear(x[token], self.experts_gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.experts_down[expert]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def _gathered(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """Each token's k experts' weights gathered: fixed shapes, for decode graphs of few tokens."""
        gate_up = self.experts_gate_up[chosen]  # [N, k, 2I, H]
        h = torch.matmul(gate_up, x[:, None, :, None]).squeeze(-1)  # [N, k, 2I]
        gate, up = h.chunk(2, dim=-1)
        y = torch.matmul(self.experts_down[chosen], (F.silu(gate) * up)[..., None]).squeeze(-1)  # [N, k, H]
        return (y * weights[..., None]).sum(dim=1)

    def _grouped(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """Tokens sorted by expert through one grouped GEMM per projection: each expert's weights are
        read once per step, whatever the number of tokens routed to it; fixed shapes, graph-safe."""
        n, k = chosen.shape
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k
        counts = torch.zeros(self.experts, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        h = torch._grouped_mm(x[token], self.experts_gate_up.transpose(-1, -2), offs=offsets)
        y = torch._grouped_mm(fusion.swiglu(h).contiguous(), self.experts_down.transpose(-1, -2), offs=offsets)
        if moe_combine.can_run(y):  # each token's k rows read where they are, summed in float32
            return moe_combine.combine_sorted(y, order, weights).to(x.dtype)
        # back to token order, a row per (token, choice): a copy, where accumulating into each token's
        # row took atomic adds; then each token's k rows weighted and summed in one batched product,
        # in float32 (Qwen3.5-35B-A3B's block, 4096 tokens, H100: 2.22 -> 1.88 ms; index_add_ alone
        # had been 0.54 ms of it)
        y = torch.empty_like(y).index_copy_(0, order, y)
        return torch.bmm(weights[:, None, :].to(y.dtype), y.view(n, k, -1)).squeeze(1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, config: LLMConfig, index: int):
        super().__init__()
        c = config
        self.linear = c.layer_types[index] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        self.moe = c.is_moe(index)
        self.mlp = MoE(c) if self.moe else MLP(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.zero_centered_norm)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.zero_centered_norm)

    def decode(self, x: Tensor, square_sums: Optional[Tensor], places: StepPlaces, state, index: int, rows: int):
        """One token per row: (the stream after the layer, its square sums or None). ``state`` holds
        the decode buffers, this layer's named by ``index``; ``rows`` of them are stepped."""
        inp = Normed(x, square_sums, self.input_layernorm)
        if self.linear:
            x, square_sums = self.linear_attn.decode(inp, state[f"conv{index}"][:rows], state[f"rec{index}"][:rows])
        else:
            x, square_sums = self.self_attn.decode(inp, places, state[f"k{index}"][:rows], state[f"v{index}"][:rows])
        return self.mlp.decode(Normed(x, square_sums, self.post_attention_layernorm))

    def _mlp(self, x: Tensor, update: Tensor) -> Tensor:
        """x + update, then the MLP (or MoE) block with its residual (prefill)."""
        x, h = self.post_attention_layernorm.after_add(x, update)
        return x + (self.mlp(h, False) if self.moe else self.mlp(h))
