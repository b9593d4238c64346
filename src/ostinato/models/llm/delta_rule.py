"""The gated delta rule of Gated DeltaNet: chunked for prefill, one token at a time for decode.

Per head, with a state S (key dim x value dim), a decay g_t (log space), a write strength beta_t
and L2-normalised q_t, k_t:  S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - k_t^T exp(g_t) S_{t-1}))^T,
o_t = S_t^T q_t / sqrt(dk). The chunked form (the WY representation of the delta rule) solves a
unit lower-triangular system per chunk and carries S from chunk to chunk; it gives the same numbers
as the recurrence up to rounding. Both run in float32, as the reference implementations do.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops import delta_rule as delta_kernel
from .fusion import fusible


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


CHUNK = 64  # tokens a chunk of the chunked rule solves at once (prefill's default)


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                       chunk: int = CHUNK) -> Tuple[Tensor, Tensor]:
    """q, k: [B, T, Hk, dk]; v: [B, T, H, dv]; g, beta: [B, T, H]; state: [B, H, dk, dv] float32. Hk
    divides H: each key head serves H / Hk value heads, consecutive ones.

    Returns (output [B, T, H, dv] in q's dtype, final state [B, H, dk, dv] float32).
    """
    batch, length, heads, _ = v.shape
    state = state.to(torch.float32)
    # a half-precision model's products on the tensor cores in TF32 (its inputs carry 8-11 bits; the
    # reference kernels multiply them in bfloat16); float32 models keep IEEE products, as PyTorch's ops
    # compute them. (Not tf32x3: Triton 3.6 made kernels of it that read out of bounds on an H100)
    precision = "tf32" if q.dtype in (torch.float16, torch.bfloat16) else "ieee"
    scan_kernel = delta_kernel.can_scan(state, chunk)
    if scan_kernel and delta_kernel.can_prepare(q, v, chunk):
        terms = delta_kernel.chunk_prepare(q, k, v, g, beta, chunk, precision)
    else:
        if q.shape[2] != heads:
            q, k = (x.repeat_interleave(heads // x.shape[2], dim=2) for x in (q, k))
        system, v_beta, k_beta_decayed, *rest = chunk_terms(q, k, v, g, beta, chunk)
        inverse = unit_lower_inverse(system)
        terms = (inverse @ v_beta, inverse @ k_beta_decayed, *rest)
    if scan_kernel:
        out, state = delta_kernel.chunk_scan(*terms, state, precision=precision)
    else:
        out, state = scan_chunks(*terms, state)
    out = out.reshape(batch, heads, -1, v.shape[-1])[:, :, :length]
    return out.transpose(1, 2).to(q.dtype), state


@fusible
def chunk_terms(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int):
    """Everything inside the chunks, for all chunks at once (float32): each chunk's triangular system
    and the two right-hand sides it is solved for (the values and the decayed keys), then the
    scan's other arguments but its state, shaped as ``ops.delta_rule.chunk_scan`` takes them."""
    batch, length, heads, dk = k.shape
    q, k, v, g, beta = (x.transpose(1, 2).to(torch.float32).contiguous() for x in (q, k, v, g, beta))
    q = l2_normalize(q) * dk ** -0.5
    k = l2_normalize(k)
    pad = (-length) % chunk
    if pad:  # padded steps write nothing (beta 0, k 0) and do not decay (g 0)
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (length + pad) // chunk
    q, k, v = (x.reshape(batch, heads, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(batch, heads, n, chunk), beta.reshape(batch, heads, n, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    decay = g.cumsum(-1)  # log of the decay from the chunk's start to each step
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    # exp(decay_i - decay_j) for j <= i, zero above the diagonal
    pair = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf")).exp()
    # (I + the strictly lower part of this) u = rhs, for the values and the decayed keys of each chunk
    system = (k_beta @ k.transpose(-1, -2)) * pair
    inner = (q @ k.transpose(-1, -2)) * pair
    q_decayed = q * decay.exp()[..., None]
    k_to_end = k * (decay[..., -1:] - decay).exp()[..., None]
    return (system, v_beta, k_beta * decay.exp()[..., None], q_decayed, inner, k_to_end,
            decay[..., -1].exp())


def unit_lower_inverse(a: Tensor) -> Tensor:
    """(I + L)^-1 for L the strictly lower part of each [..., C, C] matrix (its diagonal and upper part
    are not read): one batched triangular solve against the identity, C right-hand sides, where the
    values' and the decayed keys' solves took dv + dk (a 4096-token Qwen3.5-2B prefill on an H100
    spent 7.7 ms in the two). Not a power series: (I + N)(I + N^2)(I + N^4)... is exact in theory,
    but when a chunk's keys are nearly alike with slow decay the powers of N cancel catastrophically
    (2e2 relative error in float32 where the solve gives 4e-7)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape)
    return torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)


def scan_chunks(values: Tensor, keys_decayed: Tensor, q_decayed: Tensor, inner: Tensor, k_to_end: Tensor,
                chunk_decay: Tensor, state: Tensor) -> Tuple[Tensor, Tensor]:
    """Carry the state from chunk to chunk: each chunk's output is what its queries read from the
    state it starts with plus what the chunk itself wrote. Shapes as ``ops.delta_rule.chunk_scan``."""
    out = torch.empty_like(values)
    for i in range(values.shape[2]):
        new_v = values[:, :, i] - keys_decayed[:, :, i] @ state
        out[:, :, i] = q_decayed[:, :, i] @ state + inner[:, :, i] @ new_v
        state = state * chunk_decay[:, :, i, None, None] + k_to_end[:, :, i].transpose(-1, -2) @ new_v
    return out, state


def recurrent_delta_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> Tensor:
    """One token per row, in place on ``state``: q, k [B, H, dk]; v [B, H, dv]; g, beta [B, H];
    state [B, H, dk, dv] float32. Returns the output [B, H, dv] in q's dtype."""
    out_dtype = q.dtype
    dk = q.shape[-1]
    q = l2_normalize(q.float()) * dk ** -0.5
    k = l2_normalize(k.float())
    v, g, beta = v.float(), g.float(), beta.float()
    state.mul_(g.exp()[..., None, None])
    remembered = (state * k[..., None]).sum(dim=-2)
    delta = (v - remembered) * beta[..., None]
    state.add_(k[..., None] * delta[..., None, :])
    return (state * q[..., None]).sum(dim=-2).to(out_dtype)
