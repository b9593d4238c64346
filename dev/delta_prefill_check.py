"""Check ostinato.ops.delta_rule.chunk_prepare (everything inside the chunks of the chunked gated delta
rule: norms, decays, the triangular systems' inverses, the values and decayed keys solved for) against
the PyTorch terms (``chunk_terms`` + ``unit_lower_inverse`` + the two products) run in float64, the
scan kernel over those terms against the PyTorch loop in float64, and, on a GPU, the whole prefill
rule (prepare + scan kernels) against the one-token recurrence in float64.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/delta_prefill_check.py   # CPU, float32
    PYTHONPATH=src python dev/delta_prefill_check.py                                     # on a GPU

Cases cover key heads shared by value heads, a padded last chunk, and chunks whose keys are nearly
alike with slow decay (where an inexact inverse loses everything). Ends with
``delta prefill == reference: True`` (exit 1 otherwise).
"""
import sys

import torch

from decode_attention_check import check_setup
from ostinato.models.llm import delta_rule as rule
from ostinato.ops import delta_rule as kernels

# (rows, tokens, key heads, value heads, dk, dv, nearly alike keys)
CASES = [(1, 150, 2, 4, 32, 16, False), (2, 64, 2, 2, 64, 32, True), (1, 100, 1, 2, 128, 128, False),
         (1, 200, 2, 2, 128, 64, True)]


def inputs(rows, length, k_heads, v_heads, dk, dv, alike, device, dtype):
    g = torch.Generator().manual_seed(length + dk)
    q = torch.randn(rows, length, k_heads, dk, generator=g)
    k = torch.randn(rows, length, k_heads, dk, generator=g)
    if alike:  # one direction shared by every key, strong writes, almost no decay
        k = 0.3 * k + torch.randn(dk, generator=g)
        beta = 0.8 + 0.2 * torch.rand(rows, length, v_heads, generator=g)
        decay = -0.001 * torch.rand(rows, length, v_heads, generator=g)
    else:
        beta = torch.rand(rows, length, v_heads, generator=g)
        decay = -0.5 * torch.rand(rows, length, v_heads, generator=g)
    v = torch.randn(rows, length, v_heads, dv, generator=g)
    state = 0.1 * torch.randn(rows, v_heads, dk, dv, generator=g)
    # q and k as views of one projection, as the layer hands them over
    both = torch.cat((q, k), dim=-1).to(device=device, dtype=dtype)
    return (both[..., :dk], both[..., dk:], v.to(device=device, dtype=dtype), decay.to(device),
            beta.to(device=device, dtype=dtype), state.to(device))


def reference_terms(q, k, v, g, beta, chunk=64):
    group = v.shape[2] // q.shape[2]
    q, k = (x.double().repeat_interleave(group, dim=2) for x in (q, k))
    system, v_beta, k_beta_decayed, *rest = rule.chunk_terms(q, k, v.double(), g.double(), beta.double(), chunk)
    inverse = rule.unit_lower_inverse(system)
    return (inverse @ v_beta, inverse @ k_beta_decayed, *rest)


def check(device, on_gpu, dtype, case) -> bool:
    q, k, v, g, beta, state = inputs(*case, device, dtype)
    names = ("values", "keys_decayed", "q_decayed", "inner", "k_to_end", "chunk_decay")
    precision = "ieee" if dtype == torch.float32 else "tf32"
    got = kernels.chunk_prepare(q, k, v, g, beta, 64, precision)
    want = reference_terms(q, k, v, g, beta)
    errors = {name: ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
              for name, a, b in zip(names, got, want)}
    tol = 1e-5 if dtype == torch.float32 else 5e-3  # TF32 products for half-precision models
    ok = all(e <= tol for e in errors.values())
    worst = max(errors, key=errors.get)
    line = f"{case} {str(dtype)[6:]}: terms worst {worst} {errors[worst]:.1e}"
    # the scan kernel over those terms against the PyTorch loop in float64
    want_out, want_state = rule.scan_chunks(*(x.double() for x in got), state.double())
    out, final = kernels.chunk_scan(*got, state, precision=precision)
    out_err = ((out.double() - want_out).abs().max() / want_out.abs().max()).item()
    state_err = ((final.double() - want_state).abs().max() / want_state.abs().max()).item()
    scan_tol = 1e-5 if dtype == torch.float32 else 2e-3  # TF32 products
    ok &= out_err <= scan_tol and state_err <= scan_tol
    line += f"; scan {max(out_err, state_err):.1e}"
    if on_gpu:  # the whole rule through both kernels against the recurrence
        out, final = rule.chunked_delta_rule(q, k, v, g, beta, state)
        group = v.shape[2] // q.shape[2]
        qr, kr = (x.repeat_interleave(group, dim=2) for x in (q, k))
        want_state = state.double().clone()
        steps = torch.stack([rule.recurrent_delta_step(qr[:, t].double(), kr[:, t].double(), v[:, t].double(),
                                                       g[:, t].double(), beta[:, t].double(), want_state)
                             for t in range(q.shape[1])], dim=1)
        out_err = ((out.double() - steps).abs().max() / steps.abs().max()).item()
        state_err = ((final.double() - want_state).abs().max() / want_state.abs().max()).item()
        rule_tol = 1e-4 if dtype == torch.float32 else 2e-2
        ok &= out_err <= rule_tol and state_err <= rule_tol
        line += f"; rule: output {out_err:.1e}, state {state_err:.1e}"
    print(f"{line}: {'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    setup = check_setup(kernels.HAVE_TRITON)
    if setup is None:
        return 2
    on_gpu, device, _ = setup
    ok = True
    for dtype in [torch.float32] + ([torch.bfloat16, torch.float16] if on_gpu else []):
        for case in CASES:
            ok &= check(device, on_gpu, dtype, case)
    print(f"delta prefill == reference: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
