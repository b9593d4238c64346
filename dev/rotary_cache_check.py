"""Check ostinato.ops.rotary_cache (a decode step's q/k RMSNorm, rotary embedding and cache writes in
one kernel) against PyTorch: ``fusion.rms_norm`` per head, the rotary embedding in float32 rounded
once, and the cache scatter.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/rotary_cache_check.py   # CPU, float16
    PYTHONPATH=src python dev/rotary_cache_check.py                                     # on a GPU, + bfloat16

Cases: Qwen3's heads (norm, full rotary), Llama's (no norm), Qwen3.5's gated attention (zero-centred
norm, rotary on a quarter of a 256 head, gates between the query heads), rows at different
positions, caches with more rows than the step (views of a bigger buffer). The queries and the
written entries must agree within one rounding of the dtype; every other cache entry keeps its bytes.
Ends with ``rotary cache == reference: True`` (exit 1 otherwise).
"""
import sys

import torch

from ostinato.models.llm import fusion
from ostinato.ops import rotary_cache
from decode_attention_check import run_half_cases

# (rows, query heads, kv heads, head size, rotary half, norm, zero-centred, gated)
CASES = [
    (3, 8, 2, 128, 64, True, False, False),  # Qwen3
    (2, 4, 4, 64, 32, False, False, False),  # Llama, no GQA
    (3, 4, 2, 256, 32, True, True, True),  # Qwen3.5 full attention
    (1, 6, 1, 128, 64, True, False, False),
]


def reference(mixed, cos, sin, heads, kv_heads, dim, gated, q_norm, k_norm, eps, zero_centered):
    """(q, k, v) [B, heads, D] as the decode step's PyTorch path computes them (the rotary in float32)."""
    b = mixed.shape[0]
    q_cols = heads * dim * (2 if gated else 1)
    q, k, v = mixed.split([q_cols, kv_heads * dim, kv_heads * dim], dim=-1)
    if gated:
        q = q.reshape(b, heads, 2 * dim)[..., :dim]
    q, k, v = q.reshape(b, heads, dim), k.reshape(b, kv_heads, dim), v.reshape(b, kv_heads, dim)
    if q_norm is not None:
        q = fusion.rms_norm.uncompiled(q, q_norm, eps, zero_centered)
        k = fusion.rms_norm.uncompiled(k, k_norm, eps, zero_centered)
    c, s = cos.float()[:, None], sin.float()[:, None]

    def rotate(x):
        half = c.shape[-1]
        x = x.float()
        a, bb, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat((a * c - bb * s, bb * c + a * s, rest), -1).to(mixed.dtype)

    return rotate(q), rotate(k), v


def check(device, dtype, rows, heads, kv_heads, dim, half, norm, zero_centered, gated) -> bool:
    seq, spare = 40, 2
    q_cols = heads * dim * (2 if gated else 1)
    mixed = torch.randn(rows, q_cols + 2 * kv_heads * dim, device=device).to(dtype)
    positions = torch.randperm(seq, device=device)[:rows]
    inv_freq = 10000.0 ** (-torch.arange(half, device=device).float() / half)
    freqs = positions.float()[:, None] * inv_freq
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    q_norm = (torch.randn(dim, device=device) * 0.3 + (0.0 if zero_centered else 1.0)).to(dtype) if norm else None
    k_norm = (torch.randn(dim, device=device) * 0.3 + (0.0 if zero_centered else 1.0)).to(dtype) if norm else None
    buffer_k = torch.randn(rows + spare, kv_heads, seq, dim, device=device).to(dtype)
    buffer_v = torch.randn(rows + spare, kv_heads, seq, dim, device=device).to(dtype)
    want_k, want_v = buffer_k.clone(), buffer_v.clone()
    rq, rk, rv = reference(mixed, cos, sin, heads, kv_heads, dim, gated, q_norm, k_norm, 1e-6, zero_centered)
    at = torch.arange(rows, device=device)
    want_k[at, :, positions] = rk
    want_v[at, :, positions] = rv
    got_q = rotary_cache.qk_rotary_cache_op(mixed, inv_freq, buffer_k[:rows], buffer_v[:rows], positions, heads,
                                            gated, q_norm, k_norm, 1e-6, zero_centered)
    tol = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)  # one rounding, relative to the head's largest value

    def close(a, b):
        scale = b.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-3)
        return bool((((a.float() - b.float()).abs() / scale) <= tol).all())

    written = torch.zeros(buffer_k.shape[:3], dtype=torch.bool, device=device)
    written[at, :, positions] = True
    untouched = torch.equal(buffer_k[~written].view(torch.uint8), want_k[~written].view(torch.uint8)) and \
        torch.equal(buffer_v[~written].view(torch.uint8), want_v[~written].view(torch.uint8))
    ok = (close(got_q, rq) and close(buffer_k[at, :, positions], rk)
          and torch.equal(buffer_v[at, :, positions], rv) and untouched)
    print(f"rows {rows} heads {heads}/{kv_heads} D {dim} rotary {2 * half} norm {norm} zero-centred {zero_centered} "
          f"gated {gated} {str(dtype)[6:]}: {'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    return run_half_cases(rotary_cache.HAVE_TRITON, CASES, check, "rotary cache == reference")


if __name__ == "__main__":
    sys.exit(main())
