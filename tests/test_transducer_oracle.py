"""The float64 oracle that tells rounding ties from real mistakes in greedy transducer decoding
(``ostinato.testing.transducer_oracle``), on a small random TDT decoder on the CPU."""
import numpy as np
import pytest
import torch

from ostinato.models.transducer.label_looping import LabelLoopingDecoder
from ostinato.testing import transducer_oracle as oracle
from ostinato.testing.random_models import parakeet_tdt_v2_config, pattern, random_transducer_network

D_MODEL = 64


def small_tdt(dtype):
    cfg = parakeet_tdt_v2_config()
    cfg.encoder.n_layers, cfg.encoder.d_model, cfg.encoder.n_heads = 1, D_MODEL, 2
    return cfg, random_transducer_network(cfg, "cpu", dtype)


def encoder_output(batch, frames, dtype, seed=0):
    enc = torch.randn(batch, frames, D_MODEL, generator=torch.Generator().manual_seed(seed))
    enc[:, :, :7] = pattern(frames, 1)[None]  # the forced blank/label/duration pattern's channels
    return enc.to(dtype), [frames - 23 * i for i in range(batch)]


def decisions(cfg, net, enc, lengths):
    stepper = LabelLoopingDecoder(net.prednet, net.joint, cfg.blank_id, cfg.durations, torch.device("cpu"),
                                  use_graphs=False, steps_per_replay=1)
    return oracle.record_decisions(stepper, enc, lengths, 10)


def test_half_precision_spacing_by_hand():
    x = torch.tensor([1.0, 1.5, 50.0, -50.0, 0.75])
    assert oracle.half_ulp_units(x, torch.float16).tolist() == [2 ** -10, 2 ** -10, 2 ** -5, 2 ** -5, 2 ** -11]
    assert oracle.half_ulp_units(torch.tensor([1.0, 3.0]), torch.bfloat16).tolist() == [2 ** -7, 2 ** -6]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batched_decoder_agrees_with_the_plain_loop_up_to_ties(dtype):
    cfg, net = small_tdt(dtype)
    enc, lengths = encoder_output(6, 260, dtype)
    log = decisions(cfg, net, enc, lengths)
    hyps, plain_logs = oracle.plain_greedy_decode(net, cfg, enc, lengths, 10)
    # the log is the decoder's own arithmetic: its emitted labels are the batched decode's tokens
    decoder = LabelLoopingDecoder(net.prednet, net.joint, cfg.blank_id, cfg.durations, torch.device("cpu"),
                                  use_graphs=False)
    batched = decoder.decode(enc, torch.tensor(lengths), 10)
    for r, hyp in enumerate(batched):
        steps = np.flatnonzero(log.active[:, r] & (log.label[:, r] != cfg.blank_id))
        assert len(steps) > 10
        assert log.label[steps, r].tolist() == hyp.tokens and log.t[steps, r].tolist() == hyp.frames
        assert log.duration[steps, r].tolist() == hyp.durations
    same, divergences, replay = oracle.compare_with_plain(net, cfg, enc, lengths, log, plain_logs)
    assert oracle.check_ties(divergences, replay) is None
    assert len(same) + len(divergences) == len(lengths)
    # the rounding the run shows is a few ulps, so the tolerance is tight
    assert 0 < replay.largest_rounding_error < 16
    assert replay.worst_margin() <= replay.tolerance()


def test_half_precision_ties_exist_and_are_resolved_to_the_first_index():
    """Labels lifted to ~50 sit 1/32 apart in float16: some decisions are exact-arithmetic seconds
    that round to the same value as the best; the decoder takes the lower index (like argmax)."""
    cfg, net = small_tdt(torch.float16)
    enc, lengths = encoder_output(6, 260, torch.float16)
    log = decisions(cfg, net, enc, lengths)
    replay = oracle.exact_replay(net, cfg, enc, lengths, log)
    margins = replay.label_margin[np.isfinite(replay.label_margin)]
    assert (margins > 0).any(), "expected some near-ties in float16"
    assert margins.max() <= 1.0  # within the one ulp rounding alone gives


def test_a_wrong_decision_is_caught():
    cfg, net = small_tdt(torch.float32)
    enc, lengths = encoder_output(3, 200, torch.float32)
    log = decisions(cfg, net, enc, lengths)
    # one emitted label changed to the exact-arithmetic worst label of its step, as a decoder bug
    # would: first with the logit the decoder reported for it exact (a wrong argmax), then with the
    # decoder's logit claiming it was best (a wrong logit)
    s, r = next((s, r) for s, r in zip(*np.nonzero(log.active & (log.label != cfg.blank_id))))
    exact = oracle.exact_replay(net, cfg, enc, lengths, log, probes=[(s, r)]).probes[(s, r)]
    worst = int(np.argmin(exact[: cfg.vocab_size]))
    log.label[s, r] = worst
    for reported in (exact[worst], exact[: cfg.vocab_size].max()):
        log.logit[s, r] = reported
        problem = oracle.check_ties([], oracle.exact_replay(net, cfg, enc, lengths, log))
        assert problem is not None and f"of row {r}" in problem, problem
