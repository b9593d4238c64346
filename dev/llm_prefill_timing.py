"""Where a long prefill's time goes on the GPU (a dev probe): the whole generate call against the
network's prefill alone, per layer kind, with CUDA events; run with PYTHONPATH=src on a CUDA machine.

    python dev/llm_prefill_timing.py --shape qwen3.5-2b --tokens 4096
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ostinato import LanguageModel
from ostinato.models.llm import fusion
from ostinato.models.llm.layers import rotary_tables
from ostinato.testing.random_llms import SHAPES, random_network


def timed(fn, repeats=5):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def scan_configs(net, h, st, rows):
    """The chunk scan of one layer's prefill, captured once, timed per kernel configuration against
    the PyTorch loop, with each configuration's largest difference from it."""
    from ostinato.models.llm import delta_rule as rule
    from ostinato.ops import delta_rule as kernels

    i, layer = next((i, layer) for i, layer in enumerate(net.model.layers) if layer.linear)
    captured = {}
    rule_scan, real = rule.scan_chunks, kernels.can_scan

    def capture(*args):
        captured["args"] = [a.clone() for a in args]
        return rule_scan(*args)

    kernels.can_scan, rule.scan_chunks = (lambda *a: False), capture
    try:
        layer.linear_attn.prefill(h, st[f"conv{i}"], st[f"rec{i}"], rows)
    finally:
        kernels.can_scan, rule.scan_chunks = real, rule_scan
    args = captured["args"]
    print("scan inputs:", [tuple(a.shape) for a in args])
    want, _ = rule.scan_chunks(*args)
    print(f"pytorch loop: {timed(lambda: rule.scan_chunks(*args)) * 1e3:.2f} ms")
    for precision in ("ieee", "tf32"):  # (tf32x3 at some of these settings: an illegal address, Triton 3.6)
        for block in (16, 32, 64):
            for warps in (4, 8):
                try:
                    got, _ = kernels.chunk_scan(*args, block=block, warps=warps, precision=precision)
                    ms = timed(lambda: kernels.chunk_scan(*args, block=block, warps=warps, precision=precision)) * 1e3
                    err = (got - want).abs().max().item()
                    print(f"kernel {precision:>7} block {block:>2} warps {warps}: {ms:.2f} ms, max diff {err:.1e}")
                except Exception as exc:
                    print(f"kernel {precision} block {block} warps {warps}: {type(exc).__name__}: {str(exc)[:100]}")


def rule_paths(net, h, st, rows):
    """One layer's chunked delta rule with everything inside its chunks in one kernel (prepare) against
    the PyTorch terms and triangular solve before the same scan kernel, timed, with their difference."""
    from ostinato.models.llm import delta_rule as rule, layers
    from ostinato.ops import delta_rule as kernels

    i, layer = next((i, layer) for i, layer in enumerate(net.model.layers) if layer.linear)
    captured, real_rule = {}, layers.chunked_delta_rule

    def capture(*args):
        captured["args"] = [a.clone() for a in args]
        return real_rule(*args)

    layers.chunked_delta_rule = capture
    try:
        layer.linear_attn.prefill(h, st[f"conv{i}"], st[f"rec{i}"], rows)
    finally:
        layers.chunked_delta_rule = real_rule
    args = captured["args"]
    print("rule inputs:", [tuple(a.shape) for a in args])
    got, got_state = rule.chunked_delta_rule(*args)
    kernel_ms = timed(lambda: rule.chunked_delta_rule(*args)) * 1e3
    real = kernels.can_prepare
    kernels.can_prepare = lambda *a: False
    try:
        want, want_state = rule.chunked_delta_rule(*args)
        torch_ms = timed(lambda: rule.chunked_delta_rule(*args)) * 1e3
    finally:
        kernels.can_prepare = real
    q, k, v, g, beta, state = args
    terms = kernels.chunk_prepare(q, k, v, g, beta, 64, "ieee")
    for precision in ("tf32", "ieee"):
        for warps in (4, 8):
            for block in (32, 64):
                ms = timed(lambda: kernels.chunk_prepare(q, k, v, g, beta, 64, precision, block, warps)) * 1e3
                mine = kernels.chunk_prepare(q, k, v, g, beta, 64, precision, block, warps)
                err = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(mine, terms))
                print(f"  prepare {precision:>6} warps {warps} blocks {block}: {ms:.3f} ms (vs ieee {err:.1e})")
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    state_err = ((got_state - want_state).abs().max() / want_state.abs().max()).item()
    print(f"delta rule, one layer: prepare kernel + scan {kernel_ms:.3f} ms; PyTorch terms + scan {torch_ms:.3f} ms; "
          f"relative difference output {err:.1e}, state {state_err:.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3.5-2b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    net = random_network(SHAPES[args.shape], torch.device("cuda"), torch.bfloat16)
    model = LanguageModel.from_network(net, max_batch_size=1)
    ids = [torch.randint(0, model.config.vocab_size, (args.tokens,)).tolist()]
    model.generate(ids, max_new_tokens=1)
    print(f"generate(max_new_tokens=1): {timed(lambda: model.generate(ids, max_new_tokens=1)) * 1e3:.1f} ms")
    st, rows = model.decoder.state, torch.tensor([0], device="cuda")
    x = torch.tensor(ids, device="cuda")
    # as the decoder runs its prefill: the norm and gate chains compiled where it compiles its step
    # (without this the profile below showed their eager ops, ~10 ms of a 2B prefill)
    with torch.no_grad(), fusion.enabled(model.decoder.compile_step):
        print(f"net.prefill alone: {timed(lambda: net.prefill(x, rows, 0, st)) * 1e3:.1f} ms")
        h = net.model.embed_tokens(x)
        for kind in ("linear", "full"):
            layers = [(i, layer) for i, layer in enumerate(net.model.layers) if bool(layer.linear) == (kind == "linear")]
            if not layers:
                continue
            i, layer = layers[0]
            mixer = layer.linear_attn if layer.linear else layer.self_attn
            if layer.linear:
                def run():
                    mixer.prefill(h, st[f"conv{i}"], st[f"rec{i}"], rows)
            else:
                cos, sin = rotary_tables(torch.arange(args.tokens, device="cuda"), net.inv_freq, h.dtype)

                def run():
                    mixer.prefill(h, cos, sin, st[f"k{i}"], st[f"v{i}"], rows, 0)
            try:
                ms = timed(run) * 1e3
                print(f"{kind} mixer, one layer: {ms:.2f} ms x {len(layers)} layers = {ms * len(layers):.1f} ms")
            except Exception as exc:  # the probe's guess of a signature may be off: say so, go on
                print(f"{kind} mixer: could not time ({type(exc).__name__}: {exc})")
        first = net.model.layers[0]
        ms = timed(lambda: first.mlp(h, False) if first.moe else first.mlp(h)) * 1e3
        kind = "moe" if first.moe else "mlp"
        print(f"{kind}, one layer: {ms:.2f} ms x {len(net.model.layers)} = {ms * len(net.model.layers):.1f} ms")
        rule_paths(net, h, st, rows)
        scan_configs(net, h, st, rows)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            net.prefill(x, rows, 0, st)
            torch.cuda.synchronize()
        table = prof.key_averages()
        try:  # the GPU time per kernel name, largest first
            print(table.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))
        except Exception:  # noqa: BLE001 - the sort key's name varies across torch versions
            print(table.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
