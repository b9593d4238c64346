"""Check ostinato.models.whisper.rules_kernel against apply_logit_rules + log_softmax on random rule states.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/rules_kernel_check.py   # CPU
    PYTHONPATH=src python dev/rules_kernel_check.py                                     # on a GPU

Every case is a batch of rows over a real Whisper vocabulary layout (English-only, 51864 tokens, and
multilingual, 51865), each row with its own rule state: timestamps on or off; at, before or after the
first free step (with and without a forced prefix); last and penultimate tokens text or timestamps;
no last timestamp or one in range; several max initial timestamps; random suppression masks; optional
banned tokens (one case bans a whole row: a NaN row). The logits are arranged per row: plain noise,
heavy timestamps (the forced-timestamp rule fires), one dominant text token (it does not), exact ties
of the maximum across blocks, and two logits one ulp apart that round to the same log-probability
(torch's argmax then takes the earlier one, not the larger logit).

Checked per case: the same -inf and NaN pattern, finite log-probabilities within 1e-5, the same argmax
(first index on ties), the same forced-timestamp decisions, and for the greedy kernels (the one that
writes the log-probabilities too, and the one that splits each row over programs) the token, its
log-probability and the no-speech probability (the split one also from half-precision logits, against
the reference on their values). Prints one line per case and ends with
``rules kernel == torch: True`` (exit 1 otherwise). SEED=n repeats a run.

Importable: tests/gpu/test_rules_kernel_gpu.py uses make_case / reference / compare on CUDA.
"""
import os
import sys
import time

import numpy as np
import torch

from ostinato.models.whisper.logit_rules import VocabLayout, apply_logit_rules
from ostinato.models.whisper import rules_kernel as rk

# (layout, no-speech id) as the official vocabularies have them.
LAYOUTS = {
    "en": (VocabLayout(n_vocab=51864, eot=50256, no_timestamps=50362, timestamp_begin=50363), 50361),
    "multilingual": (VocabLayout(n_vocab=51865, eot=50257, no_timestamps=50363, timestamp_begin=50364), 50362),
    "v3": (VocabLayout(n_vocab=51866, eot=50257, no_timestamps=50364, timestamp_begin=50365), 50363),
}
ATOL = 1e-5
STATE_KEYS = ("timestamps", "max_initial_timestamp", "n_generated", "last_token", "penultimate_token",
              "last_timestamp", "sample_begin")
ARRANGEMENTS = ("plain", "ts_heavy", "text_peak", "tie", "round_tie", "ts_heavy", "plain")


def _choice(gen, options):
    return options[int(torch.randint(len(options), (), generator=gen))]


def _randint(gen, lo, hi):
    return int(torch.randint(lo, hi, (), generator=gen))


def make_case(layout: VocabLayout, rows: int, gen: torch.Generator, *, with_banned=False, ban_all_row=None,
              with_sample_begin=True, arrangements=None):
    """A batch of random rule states and logits (CPU tensors): dict of apply_logit_rules' arguments
    plus ``logits`` and ``arrangement`` (one name per row)."""
    V, tb, eot = layout.n_vocab, layout.timestamp_begin, layout.eot
    n_ts = V - tb
    suppress = torch.rand(V, generator=gen) < 0.03
    suppress[eot + 1 : layout.no_timestamps] |= torch.rand(layout.no_timestamps - eot - 1, generator=gen) < 0.8
    suppress_at_begin = torch.zeros(V, dtype=torch.bool)
    suppress_at_begin[[220, eot]] = True
    banned = None
    if with_banned:
        banned = torch.rand(rows, V, generator=gen) < 0.005
        if ban_all_row is not None:
            banned[ban_all_row] = True

    state = {k: [] for k in STATE_KEYS}
    logits = torch.randn(rows, V, generator=gen)
    names = []
    for r in range(rows):
        name = arrangements[r % len(arrangements)] if arrangements else _choice(gen, ARRANGEMENTS)
        # A rounding tie is a text-token affair: keep the timestamp rules (initial step, force) out of it.
        ts_on = bool(torch.rand((), generator=gen) < 0.8) and name != "round_tie"
        sample_begin = _choice(gen, (0, 0, 0, 1, 3)) if with_sample_begin else 0
        phase = _choice(gen, ("first", "prefix", "later", "later", "later", "later"))
        if phase == "prefix" and sample_begin == 0:
            phase = "first"
        n = {"first": sample_begin, "prefix": _randint(gen, 0, max(sample_begin, 1)),
             "later": sample_begin + _randint(gen, 1, 30)}[phase]

        def token(kind):
            return _randint(gen, 0, eot) if kind == "text" else tb + _randint(gen, 0, n_ts)

        last = token(_choice(gen, ("text", "ts", "ts"))) if n > 0 else -1
        penult = token(_choice(gen, ("text", "ts"))) if n > 1 else -1
        if _choice(gen, (0, 1, 1)) == 0:
            last_ts = -1
        elif last >= tb and _choice(gen, (0, 1)):
            last_ts = last
        else:
            last_ts = tb + _randint(gen, 0, n_ts)
        max_init = _choice(gen, (0, 1, 50, n_ts - 1, n_ts + 5))
        for key, value in zip(STATE_KEYS, (ts_on, max_init, n, last, penult, last_ts, sample_begin)):
            state[key].append(value)

        row = logits[r]
        row.mul_(1.0 + 2.0 * float(torch.rand((), generator=gen)))
        if name == "ts_heavy":  # the timestamps' total mass beats the best text token
            row[tb:] += 6.0 + 4.0 * float(torch.rand((), generator=gen))
        elif name == "text_peak":  # one text token dominates: no timestamp is forced
            row[_randint(gen, 0, eot)] += 25.0
        elif name == "tie":
            # The maximum at several indices: in different blocks and both parts, and at indices a
            # whole block apart (the same lane of the kernel's per-lane accumulators).
            top = float(row.max()) + 1.0
            a = _randint(gen, 0, rk.BLOCK)
            for i in (a, a + rk.BLOCK, a + 3 * rk.BLOCK, _randint(gen, 4096, 20000), _randint(gen, 20000, eot),
                      tb + _randint(gen, 0, n_ts), tb + _randint(gen, 0, n_ts)):
                row[i] = top
        elif name == "round_tie":
            # x and nextafter(x) with the smaller one first, above everything else: their
            # log-probabilities (x - max) - log_sum (log_sum about 8, its ulp 4 or 8 times x's) round
            # to the same float32, so torch's argmax takes the earlier index, not the larger logit.
            row.copy_(torch.randn(V, generator=gen) * 0.5 - 2.0)
            i, j = sorted((_randint(gen, 0, eot), _randint(gen, 0, eot)))
            if i == j:
                j = i + 1
            row[i] = 1.0
            row[j] = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
            suppress[[i, j]] = False
            suppress_at_begin[[i, j]] = False
            if banned is not None and r != ban_all_row:
                banned[r, [i, j]] = False
        names.append(name)

    case = dict(
        logits=logits,
        suppress=suppress,
        suppress_at_begin=suppress_at_begin,
        timestamps=torch.tensor(state["timestamps"], dtype=torch.bool),
        max_initial_timestamp=torch.tensor(state["max_initial_timestamp"], dtype=torch.int64),
        n_generated=torch.tensor(state["n_generated"], dtype=torch.int64),
        last_token=torch.tensor(state["last_token"], dtype=torch.int64),
        penultimate_token=torch.tensor(state["penultimate_token"], dtype=torch.int64),
        last_timestamp=torch.tensor(state["last_timestamp"], dtype=torch.int64),
        sample_begin=torch.tensor(state["sample_begin"], dtype=torch.int64) if with_sample_begin else None,
        banned=banned,
    )
    case["arrangement"] = names
    return case


def rule_args(case, device=None):
    """apply_logit_rules' keyword arguments (everything but logits and layout), on ``device``."""
    out = {}
    for key in ("suppress", "suppress_at_begin") + STATE_KEYS + ("banned",):
        value = case[key]
        out[key] = value.to(device) if (value is not None and device is not None) else value
    return out


def reference(case, layout, no_speech, device=None):
    """The PyTorch path of WindowDecoder._step (greedy) on ``device``: logprobs, token, logprob,
    no-speech probability, which rows had a timestamp forced, and float64 log-probabilities of the
    same filtered logits (the exact values both float32 computations approximate)."""
    logits = case["logits"].to(device) if device is not None else case["logits"]
    args = rule_args(case, device)
    filtered = apply_logit_rules(logits, layout, **args)
    logprobs = torch.log_softmax(filtered, dim=-1)
    token = logprobs.argmax(dim=-1)
    logprob = logprobs.gather(1, token[:, None])[:, 0]
    no_speech_prob = torch.exp(logits[:, no_speech] - torch.logsumexp(logits, dim=-1))
    return dict(logprobs=logprobs, token=token, logprob=logprob, no_speech=no_speech_prob,
                forced=forced_rows(case, layout, logprobs, device),
                logprobs64=torch.log_softmax(filtered.double(), dim=-1))


def close(out, ref, ref64):
    """(ok, worst |out - ref|, worst |out - exact|) on entries finite in both: ``out`` within ATOL of
    PyTorch's float32 value, or of the exact value where PyTorch's own rounding error is what parts
    them (its float32 sum of exponentials drops small terms next to a dominant one: up to ~2e-5
    on the CPU), and always within ATOL of the exact value."""
    finite = torch.isfinite(ref) & torch.isfinite(out)
    if not finite.any():
        return True, 0.0, 0.0
    out, ref, ref64 = out[finite].double(), ref[finite].double(), ref64[finite]
    to_ref = (out - ref).abs()
    to_exact = (out - ref64).abs()
    ok = bool(((to_ref < ATOL) | (to_ref <= (ref - ref64).abs() + ATOL)).all()) and bool((to_exact < ATOL).all())
    return ok, float(to_ref.max()), float(to_exact.max())


def forced_rows(case, layout, logprobs, device=None):
    """Rows whose text tokens the force rule removed: text survived the masks (seen on logits where no
    timestamp can win: the masks do not depend on the values) but not the whole rules."""
    tb = layout.timestamp_begin
    probe = torch.zeros_like(case["logits"])
    probe[:, tb:] = -1e4
    probe = probe.to(device) if device is not None else probe
    masked = apply_logit_rules(probe, layout, **rule_args(case, device))
    text_allowed = torch.isfinite(masked[:, :tb]).any(dim=1)
    return text_allowed & ~torch.isfinite(logprobs[:, :tb]).any(dim=1) & ~torch.isnan(logprobs).any(dim=1)


def force_margin(case, layout, device=None):
    """|timestamp logprob - best text logprob| of the force rule (float64), per row; inf where the
    rule is not consulted. Cases within a few ulps could decide either way and are worth knowing of."""
    logits = (case["logits"].to(device) if device is not None else case["logits"]).double()
    tb = layout.timestamp_begin
    probe = torch.zeros_like(case["logits"])
    probe[:, tb:] = -1e4
    probe = probe.to(device) if device is not None else probe
    allowed = torch.isfinite(apply_logit_rules(probe, layout, **rule_args(case, device)))
    lp = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    margin = (torch.logsumexp(lp[:, tb:], dim=-1) - lp[:, :tb].max(dim=-1).values).abs()
    return torch.where(torch.isfinite(margin), margin, torch.full_like(margin, float("inf")))


def compare_logprobs(ref, out):
    """(ok, message) for a kernel's [B, V] logprobs against the reference's."""
    problems = []
    expected = ref["logprobs"]
    if out.shape != expected.shape or out.dtype != expected.dtype:
        return False, f"shape/dtype {tuple(out.shape)} {out.dtype} vs {tuple(expected.shape)} {expected.dtype}"
    if not torch.equal(torch.isneginf(out), torch.isneginf(expected)):
        rows = torch.nonzero((torch.isneginf(out) != torch.isneginf(expected)).any(1)).flatten().tolist()
        problems.append(f"-inf pattern differs in rows {rows}")
    if not torch.equal(torch.isnan(out), torch.isnan(expected)):
        problems.append("NaN pattern differs")
    if torch.isposinf(out).any():
        problems.append("+inf in the output")
    ok, to_ref, to_exact = close(out, expected, ref["logprobs64"])
    summary = f"max |diff| {to_ref:.2g} (to float64 {to_exact:.2g})"
    if not ok:
        problems.append(summary)
    if not torch.equal(out.argmax(dim=-1), expected.argmax(dim=-1)):
        problems.append(f"argmax {out.argmax(dim=-1).tolist()} vs {expected.argmax(dim=-1).tolist()}")
    return not problems, "; ".join(problems) or summary


def compare_greedy(ref, token, logprob, no_speech):
    problems = []
    if token.dtype != torch.int64 or not torch.equal(token, ref["token"]):
        problems.append(f"token {token.tolist()} vs {ref['token'].tolist()}")
    index = ref["token"][:, None].clamp(0, ref["logprobs64"].shape[1] - 1)
    same_nan = torch.equal(torch.isnan(logprob), torch.isnan(ref["logprob"]))
    ok, lp_diff, _ = close(logprob, ref["logprob"], ref["logprobs64"].gather(1, index)[:, 0])
    if not same_nan or not ok or logprob.dtype != torch.float32:
        problems.append(f"logprob {logprob.tolist()} vs {ref['logprob'].tolist()}")
    ns_diff = (no_speech - ref["no_speech"]).abs().max().item() if no_speech.numel() else 0.0
    if not ns_diff < ATOL or no_speech.dtype != torch.float32:
        problems.append(f"no_speech differs by {ns_diff:.3g}")
    return not problems, "; ".join(problems) or f"logprob |diff| {lp_diff:.2g}, no_speech |diff| {ns_diff:.2g}"


def run_case(case, layout, no_speech, device, stats, label):
    """Run both kernels on one case, compare with the reference; returns ok."""
    ref = reference(case, layout, no_speech, device)
    logits = case["logits"].to(device)
    args = rule_args(case, device)
    out = rk.fused_filtered_log_softmax(logits, layout, **args)
    token, logprob, ns, out2 = rk.fused_greedy_choice(logits, layout, **args, no_speech=no_speech,
                                                      return_logprobs=True)
    # Without the log-probabilities written: the vocabulary split over programs (a greedy step's kernel)
    split_token, split_logprob, split_ns = rk.fused_greedy_choice(logits, layout, **args, no_speech=no_speech)
    ok1, msg1 = compare_logprobs(ref, out)
    ok2, msg2 = compare_greedy(ref, token, logprob, ns)
    ok5, msg5 = compare_greedy(ref, split_token, split_logprob, split_ns)
    if not ok5:
        msg2 += f"; split: {msg5}"
    # A half model's step hands the split kernel its half-precision logits: the reference takes their values
    half = logits.half()
    ref_half = reference(dict(case, logits=half.float().to(case["logits"].device)), layout, no_speech, device)
    ok6, msg6 = compare_greedy(ref_half, *rk.fused_greedy_choice(half, layout, **args, no_speech=no_speech))
    if not ok6:
        msg2 += f"; split, half logits: {msg6}"
    ok5 = ok5 and ok6
    same = torch.equal(out.nan_to_num(0.0, 0.0, 0.0), out2.nan_to_num(0.0, 0.0, 0.0))
    forced = forced_rows(case, layout, out, device)
    ok3 = torch.equal(forced, ref["forced"])
    ok4 = bool(torch.equal(token, out.argmax(dim=-1)))
    margin = force_margin(case, layout, device)
    stats["forced"] += int(ref["forced"].sum())
    eligible = (ref["forced"] == False) & torch.isfinite(margin)  # noqa: E712 - rule consulted, not forced
    stats["not_forced"] += int(eligible.sum())
    stats["min_margin"] = min(stats["min_margin"], float(margin.min()))
    raw_argmax = apply_logit_rules(logits, layout, **args).argmax(dim=-1)
    stats["rounding_ties"] += int((raw_argmax != ref["token"]).sum())
    stats["nan_rows"] += int(torch.isnan(ref["logprobs"]).any(dim=1).sum())
    ok = ok1 and ok2 and same and ok3 and ok4 and ok5
    notes = []
    if not same:
        notes.append("greedy kernel's logprobs != log_softmax kernel's")
    if not ok3:
        notes.append(f"forced {forced.tolist()} vs {ref['forced'].tolist()}")
    if not ok4:
        notes.append("token != argmax(logprobs)")
    print(f"{label}: {'ok' if ok else 'MISMATCH'}  logprobs: {msg1}  greedy: {msg2}  "
          f"forced rows {int(ref['forced'].sum())}/{len(case['arrangement'])}"
          + "".join(f"  {n}" for n in notes), flush=True)
    return ok


def new_stats():
    return dict(forced=0, not_forced=0, min_margin=float("inf"), rounding_ties=0, nan_rows=0)


def plan(sizes):
    """(layout name, rows, make_case options) for every case of a run."""
    out = []
    for name in ("en", "multilingual"):
        out.append((name, sizes[0], dict()))
        for rows in sizes[1:]:
            out.append((name, rows, dict(with_banned=True)))
            out.append((name, rows, dict(arrangements=("ts_heavy", "round_tie", "tie", "text_peak", "plain"))))
    out.append(("multilingual", 2, dict(with_banned=True, ban_all_row=1)))
    out.append(("v3", 3, dict(with_sample_begin=False)))
    return out


def check_coverage(stats, required=("forced", "not_forced", "rounding_ties", "nan_rows")):
    """The run must have exercised both outcomes of the force rule, rounding ties and a NaN row."""
    missing = [k for k in required if stats[k] == 0]
    print(f"coverage: {stats['forced']} forced rows, {stats['not_forced']} rows where the rule held back, "
          f"{stats['rounding_ties']} rows where argmax(logprobs) != argmax(logits), {stats['nan_rows']} NaN rows; "
          f"closest force margin {stats['min_margin']:.3g}")
    if missing:
        print(f"not covered: {missing}")
    return not missing


def main():
    seed = int(os.environ.get("SEED", "0"))
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not rk.HAVE_TRITON:
        print("triton is not installed")
        sys.exit(1)
    device = torch.device("cpu" if interpret or not torch.cuda.is_available() else "cuda")
    sizes = (1, 5) if device.type == "cpu" else (1, 16, 80)
    if device.type == "cpu":
        # The references are small tensor ops: on a busy machine, OpenMP workers waiting on each
        # other make them many times slower than one thread.
        torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    stats = new_stats()
    ok = True
    start = time.time()
    # (The interpreter computes through NumPy: log(0) and -inf - -inf are meant, not warnings.)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i, (name, rows, options) in enumerate(plan(sizes)):
            layout, no_speech = LAYOUTS[name]
            case = make_case(layout, rows, gen, **options)
            extra = ",".join(f"{k}={v}" for k, v in options.items() if k != "arrangements") or "-"
            ok &= run_case(case, layout, no_speech, device, stats, f"case {i:2d} {name:12s} B={rows:2d} {extra}")
    ok &= check_coverage(stats)
    print(f"seed {seed}, {device}, {time.time() - start:.1f} s")
    print(f"rules kernel == torch: {ok}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
