"""Whisper's next-token rules on a toy vocabulary, checked against hand-worked cases."""

import torch

from ostinato.models.whisper.logit_rules import VocabLayout, apply_logit_rules

# ids 0-4 text, 5 end-of-text, 6 another special, 7 <|notimestamps|>, 8-11 timestamps
LAYOUT = VocabLayout(n_vocab=12, eot=5, no_timestamps=7, timestamp_begin=8)
NONE = torch.zeros(12, dtype=torch.bool)


def allowed(logits, **state):
    rows = logits.shape[0]
    defaults = dict(
        suppress=NONE,
        suppress_at_begin=NONE,
        timestamps=torch.ones(rows, dtype=torch.bool),
        max_initial_timestamp=torch.full((rows,), 1),
        n_generated=torch.zeros(rows, dtype=torch.long),
        last_token=torch.full((rows,), -1),
        penultimate_token=torch.full((rows,), -1),
        last_timestamp=torch.full((rows,), -1),
    )
    defaults.update(state)
    out = apply_logit_rules(logits.clone(), LAYOUT, **defaults)
    return [sorted(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for row in out]


def t(*values):
    return torch.tensor(values)


def test_first_step_only_early_timestamps():
    logits = torch.zeros(1, 12)
    assert allowed(logits) == [[8, 9]]  # max_initial_timestamp index 1
    assert allowed(logits, max_initial_timestamp=t(3)) == [[8, 9, 10, 11]]


def test_without_timestamp_rules_only_suppression_applies():
    logits = torch.zeros(1, 12)
    suppress = NONE.clone()
    suppress[[1, 6]] = True
    begin = NONE.clone()
    begin[[0, 5]] = True
    got = allowed(logits, timestamps=t(False), suppress=suppress, suppress_at_begin=begin)
    assert got == [[2, 3, 4, 7, 8, 9, 10, 11]]
    # Begin suppression stops after the first token.
    got = allowed(logits, timestamps=t(False), suppress=suppress, suppress_at_begin=begin, n_generated=t(1), last_token=t(3))
    assert got == [[0, 2, 3, 4, 5, 7, 8, 9, 10, 11]]


def test_timestamp_right_after_the_first_counts_as_a_pair():
    # After one sampled timestamp the previous token is taken to be that timestamp: text must follow.
    logits = torch.zeros(1, 12)
    logits[0, :5] = 5.0  # text clearly likelier, so no forced timestamp
    got = allowed(logits, n_generated=t(1), last_token=t(9), last_timestamp=t(9))
    assert got == [[0, 1, 2, 3, 4, 5, 6]]


def test_open_pair_allows_only_later_timestamps_or_end():
    logits = torch.zeros(1, 12)
    logits[0, 5] = 5.0  # end-of-text outweighs the timestamps' ln 3 = 1.1, so nothing is forced
    got = allowed(logits, n_generated=t(3), last_token=t(9), penultimate_token=t(2), last_timestamp=t(9))
    assert got == [[5, 6, 9, 10, 11]]
    logits[0, 5] = 0.0  # now the three timestamps together (ln 3) beat every other token
    got = allowed(logits, n_generated=t(3), last_token=t(9), penultimate_token=t(2), last_timestamp=t(9))
    assert got == [[9, 10, 11]]


def test_closed_pair_forbids_timestamps():
    logits = torch.zeros(1, 12)
    logits[0, :5] = 5.0
    got = allowed(logits, n_generated=t(4), last_token=t(10), penultimate_token=t(9), last_timestamp=t(10))
    assert got == [[0, 1, 2, 3, 4, 5, 6]]


def test_timestamps_increase_and_mass_forces_a_timestamp():
    # After text, with the last timestamp at 10: the next one must be later, so 8, 9 and 10 are
    # gone (CTranslate2 4.x; only a pair's closing timestamp may repeat the opening one).
    logits = torch.zeros(1, 12)
    logits[0, :5] = 1.0
    logits[0, 11] = 1.2  # the one allowed timestamp outweighs the best text token: force it
    got = allowed(logits, n_generated=t(5), last_token=t(3), penultimate_token=t(2), last_timestamp=t(10))
    assert got == [[11]]
    logits[0, 11] = 0.9  # 0.9 < 1.0: text stays allowed
    got = allowed(logits, n_generated=t(5), last_token=t(3), penultimate_token=t(2), last_timestamp=t(10))
    assert got == [[0, 1, 2, 3, 4, 5, 6, 11]]


def test_after_a_forced_prefix():
    # sample_begin = 2: steps before it only see the suppression masks; the first free step has
    # the begin-suppression but no first-timestamp rule; pair rules count from sample_begin.
    logits = torch.zeros(1, 12)
    begin = torch.zeros(12, dtype=torch.bool)
    begin[5] = True
    got = allowed(logits, suppress_at_begin=begin, n_generated=t(1), sample_begin=t(2), last_token=t(8))
    assert got == [[0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11]]
    got = allowed(logits, suppress_at_begin=begin, n_generated=t(2), sample_begin=t(2), last_token=t(3),
                  penultimate_token=t(8))
    assert got == [[0, 1, 2, 3, 4, 6, 8, 9, 10, 11]]
    # One free timestamp after the prefix counts as a whole pair (the forced token before it is
    # not looked at), so text must follow; one free timestamp after text opens a pair.
    logits[0, 5] = 5.0
    got = allowed(logits, n_generated=t(3), sample_begin=t(2), last_token=t(9), penultimate_token=t(3),
                  last_timestamp=t(9))
    assert got == [[0, 1, 2, 3, 4, 5, 6]]
    got = allowed(logits, n_generated=t(4), sample_begin=t(2), last_token=t(9), penultimate_token=t(3),
                  last_timestamp=t(9))
    assert got == [[5, 6, 9, 10, 11]]


def test_rows_are_independent():
    logits = torch.zeros(2, 12)
    got = allowed(
        logits,
        timestamps=t(True, False),
        n_generated=t(0, 2),
        last_token=t(-1, 3),
        penultimate_token=t(-1, 2),
    )
    assert got == [[8, 9], list(range(12))]


def test_row_ranges_equal_the_batched_masks_on_random_states():
    # the CPU's row-by-row rules against the batched tensor form (what CUDA graphs run), bit for bit,
    # over random states: steps around a forced prefix, text / special / timestamp histories, no
    # timestamp yet, rules off, initial limits past the vocabulary, repeated n-grams banned
    from ostinato.models.whisper.logit_rules import _apply_as_tensors, _apply_by_rows

    gen = torch.Generator().manual_seed(0)
    V = 12
    for trial in range(400):
        rows = int(torch.randint(1, 7, (1,), generator=gen))

        def ints(low, high):
            return torch.randint(low, high, (rows,), generator=gen)

        logits = torch.randn(rows, V, generator=gen) * 3
        if trial % 5 == 0:
            logits[:, 8:] += 6.0  # timestamps likely enough to be forced
        state = dict(
            suppress=torch.rand(V, generator=gen) < 0.15,
            suppress_at_begin=torch.rand(V, generator=gen) < 0.2,
            timestamps=torch.rand(rows, generator=gen) < 0.8,
            max_initial_timestamp=ints(-2, 6),
            n_generated=ints(0, 5),
            last_token=ints(-1, V),
            penultimate_token=ints(-1, V),
            last_timestamp=torch.where(torch.rand(rows, generator=gen) < 0.3, -1, ints(8, V)),
            sample_begin=ints(0, 3),
            banned=(torch.rand(rows, V, generator=gen) < 0.1) if trial % 3 == 0 else None,
        )
        args = [state[k] for k in ("suppress", "suppress_at_begin", "timestamps", "max_initial_timestamp",
                                   "n_generated", "last_token", "penultimate_token", "last_timestamp",
                                   "sample_begin", "banned")]
        want = _apply_as_tensors(logits, LAYOUT, *args)
        got = _apply_by_rows(logits, LAYOUT, *args)
        assert torch.equal(got, want), (trial, state)
