"""The fused Whisper rules kernel on CUDA: log-probabilities, greedy tokens, forced-timestamp decisions
and no-speech probabilities equal to apply_logit_rules + log_softmax (the PyTorch CUDA path) at batch
1, 16 and 80, eagerly and replayed from a captured CUDA graph with new rule states and logits."""
import importlib.util
from pathlib import Path

import pytest
import torch

from ostinato.models.whisper import rules_kernel as rk
from ostinato.ops.triton_support import kernels_can_run

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _load_check():
    spec = importlib.util.spec_from_file_location("rules_kernel_check", ROOT / "dev" / "rules_kernel_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load_check()


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not kernels_can_run("cuda"):
        pytest.skip("Triton is not installed or OSTINATO_NO_TRITON=1")


@pytest.mark.parametrize("rows", [1, 16, 80])
@pytest.mark.parametrize("layout_name", ["en", "multilingual", "v3"])
def test_matches_torch_on_cuda(rows, layout_name):
    layout, no_speech = check.LAYOUTS[layout_name]
    gen = torch.Generator().manual_seed(rows * 7 + len(layout_name))
    stats = check.new_stats()
    ok = True
    for options in (dict(), dict(with_banned=True), dict(with_sample_begin=False),
                    dict(arrangements=("ts_heavy", "round_tie", "tie", "text_peak", "plain"))):
        case = check.make_case(layout, rows, gen, **options)
        ok &= check.run_case(case, layout, no_speech, torch.device("cuda"), stats, f"{layout_name} B={rows} {options}")
    assert ok
    if rows >= 16:
        assert check.check_coverage(stats, required=("forced", "not_forced", "rounding_ties"))


def test_all_masked_row_is_nan_like_torch():
    layout, no_speech = check.LAYOUTS["multilingual"]
    case = check.make_case(layout, 3, torch.Generator().manual_seed(5), with_banned=True, ban_all_row=2)
    stats = check.new_stats()
    assert check.run_case(case, layout, no_speech, torch.device("cuda"), stats, "ban all of row 2")
    assert stats["nan_rows"] == 1


def _static_inputs(case, device):
    static = {"logits": case["logits"].to(device)}
    static.update({k: v.to(device) for k, v in check.rule_args(case).items() if v is not None})
    return static


@pytest.mark.parametrize("rows,with_banned", [(1, False), (16, True), (80, False)])
def test_cuda_graph_replay_equals_torch(rows, with_banned):
    layout, no_speech = check.LAYOUTS["multilingual"]
    gen = torch.Generator().manual_seed(rows)
    device = torch.device("cuda")
    static = _static_inputs(check.make_case(layout, rows, gen, with_banned=with_banned), device)
    logits = static["logits"]
    args = {k: v for k, v in static.items() if k != "logits"}

    def step():
        out = rk.fused_filtered_log_softmax(logits, layout, **args)
        greedy = rk.fused_greedy_choice(logits, layout, **args, no_speech=no_speech)
        return out, greedy

    # Compile outside the capture, on a side stream as torch.cuda.graph expects for warm-up.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, (static_token, static_logprob, static_ns) = step()

    stats = check.new_stats()
    for replay in range(4):
        case = check.make_case(layout, rows, gen, with_banned=with_banned,
                               arrangements=("ts_heavy", "round_tie", "tie", "text_peak", "plain") if replay % 2 else None)
        for key, value in _static_inputs(case, device).items():
            static[key].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        ref = check.reference(case, layout, no_speech, device)
        ok, message = check.compare_logprobs(ref, static_out)
        assert ok, f"replay {replay}: {message}"
        ok, message = check.compare_greedy(ref, static_token, static_logprob, static_ns)
        assert ok, f"replay {replay}: {message}"
        assert torch.equal(check.forced_rows(case, layout, static_out, device), ref["forced"])
        stats["forced"] += int(ref["forced"].sum())
        eager_token = rk.fused_greedy_choice(static["logits"], layout, **args, no_speech=no_speech)[0]
        assert torch.equal(eager_token, static_token)
