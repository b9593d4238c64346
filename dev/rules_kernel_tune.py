"""Time the greedy rules kernel per launch configuration (GPU): warps per program and block width.

    PYTHONPATH=src python dev/rules_kernel_tune.py

One captured launch of ``fused_greedy_choice`` per configuration, replayed, median over repeats,
at batch 1 and 16 on random rule states (dev/rules_kernel_check.make_case); also whether each
configuration picks the same tokens as PyTorch's ops (dev/rules_kernel_check.reference). Prints one line per (batch, warps, block).
"""
import torch

from rules_kernel_check import LAYOUTS, make_case, reference, rule_args  # noqa: E402

from ostinato.models.whisper import rules_kernel as rk  # noqa: E402
from ostinato.testing.measure import replay_median_us  # noqa: E402


def timed(fn, replays=200, repeats=5) -> float:
    return replay_median_us(fn, fn, repeats, replays)


def main() -> None:
    layout, no_speech = LAYOUTS["v3"]
    print(f"device {torch.cuda.get_device_name()}")
    for rows in (1, 16):
        case = make_case(layout, rows, torch.Generator().manual_seed(rows))
        logits = case["logits"].cuda()
        args = rule_args(case, "cuda")
        call = lambda: rk.fused_greedy_choice(logits, layout, **args, no_speech=no_speech)  # noqa: E731
        want = reference(case, layout, no_speech, "cuda")["token"]
        for warps in (4, 8, 16, 32):
            for block in (2048, 4096, 8192):
                rk.NUM_WARPS, rk.BLOCK = warps, block
                try:
                    us = timed(call)
                    same = torch.equal(call()[0], want)
                    print(f"B={rows:<3} warps={warps:<3} block={block:<5} {us:7.1f} us  same tokens {same}", flush=True)
                except Exception as exc:  # noqa: BLE001 - a configuration that does not compile
                    print(f"B={rows:<3} warps={warps:<3} block={block:<5} failed: {type(exc).__name__}: {exc}"[:160])
        rk.NUM_WARPS, rk.BLOCK = 8, 4096


if __name__ == "__main__":
    main()
