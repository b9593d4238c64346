"""The chunked gated delta rule (prefill) against the one-token recurrence run in float64, on the CPU:
random inputs across chunk boundaries, and chunks whose keys are nearly alike with slow decay, where
a power-series inverse of a chunk's triangular system loses everything to cancellation."""
import torch
import torch.nn.functional as F

from ostinato.models.llm.delta_rule import chunked_delta_rule, recurrent_delta_step


def recurrence(q, k, v, g, beta, state):
    state = state.double().clone()
    steps = [recurrent_delta_step(q[:, t].double(), k[:, t].double(), v[:, t].double(), g[:, t].double(),
                                  beta[:, t].double(), state) for t in range(q.shape[1])]
    return torch.stack(steps, dim=1), state


def inputs(alike: bool, seed: int, length: int = 150, heads: int = 2, dk: int = 32, dv: int = 16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, length, heads, dk, generator=g)
    k = torch.randn(2, length, heads, dk, generator=g)
    if alike:  # one direction shared by every key, strong writes, almost no decay
        k = 0.3 * k + torch.randn(dk, generator=g)
        beta = 0.8 + 0.2 * torch.rand(2, length, heads, generator=g)
        decay = -0.001 * torch.rand(2, length, heads, generator=g)
    else:
        beta = torch.rand(2, length, heads, generator=g)
        decay = -0.5 * torch.rand(2, length, heads, generator=g)
    v = torch.randn(2, length, heads, dv, generator=g)
    state = 0.1 * torch.randn(2, heads, dk, dv, generator=g)
    return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, decay, beta, state


def test_chunked_rule_equals_the_float64_recurrence_across_chunks():
    q, k, v, g, beta, state = inputs(alike=False, seed=0)
    got, got_state = chunked_delta_rule(q, k, v, g, beta, state)  # 150 tokens: 3 chunks, the last padded
    want, want_state = recurrence(q, k, v, g, beta, state)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_state.double(), want_state, rtol=1e-4, atol=1e-4)


def test_chunked_rule_stays_exact_when_a_chunks_keys_are_nearly_alike():
    q, k, v, g, beta, state = inputs(alike=True, seed=1)
    got, got_state = chunked_delta_rule(q, k, v, g, beta, state)
    want, want_state = recurrence(q, k, v, g, beta, state)
    scale = want.abs().max()
    assert ((got.double() - want).abs().max() / scale).item() < 1e-4
    assert ((got_state.double() - want_state).abs().max() / want_state.abs().max()).item() < 1e-4


def test_the_chunk_scan_takes_wider_tiles_only_where_narrow_ones_would_not_fit_one_wave():
    from ostinato.ops.delta_rule import scan_block

    assert scan_block(128, 128, 132) == 16  # Qwen3.5-2B's 16 heads: one wave of 16-column programs
    assert scan_block(256, 128, 132) == 32  # Qwen3.5-35B-A3B's 32 heads: two waves at 16, one at 32
    assert scan_block(256, 16, 132) == 16  # no wider tile than the values
