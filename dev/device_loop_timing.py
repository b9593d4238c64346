"""Whole decode calls on the device loop against the K-step rung, interleaved, with their phases.

    PYTHONPATH=src python dev/device_loop_timing.py [--sizes tiny large-v3] [--batches 1 16]

Two decoders over one random float16 model (device loop on / off) take turns on the same forced
request (``--steps`` tokens, every row finishing together), so drift of the machine hits both
alike. Per call, host wall-clock time of: start (reset rows, rules), admit (cross K/V and the
eager prefill), the decode loop (launches and the host syncs of the done flags, until every row
is done) and results; medians over ``--repeats``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ostinato.testing.random_models import forced_requests, random_whisper, whisper_tokenizer

from ostinato.models.whisper.decoding import SearchOptions, WindowDecoder, window_jobs


def timed_call(decoder, features, requests, suppress) -> dict:
    marks = {}

    def mark(name):
        torch.cuda.synchronize()
        marks[name] = time.perf_counter()

    mark("begin")
    run = decoder.start(SearchOptions(), suppress, [], len(requests))
    mark("start")
    run.admit(window_jobs(features, requests))
    mark("admit")
    launches, results = 0, {}
    while run.busy:
        run.advance()
        launches += 1
        results.update(run.collect())
    mark("loop")
    assert {len(r.tokens) for r in results.values()} == {requests[0].max_new_tokens}
    phases = dict(start=marks["start"] - marks["begin"], admit=marks["admit"] - marks["start"],
                  loop=marks["loop"] - marks["admit"])
    phases["total"] = marks["loop"] - marks["begin"]
    return dict({k: 1e3 * v for k, v in phases.items()}, launches=launches)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["tiny", "large-v3"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print(f"{'model':<9}{'B':>4}  {'rung':<12}{'calls ms':>10}{'start':>8}{'admit':>8}{'loop':>8}{'launches':>10}")
    for size in args.sizes:
        model = random_whisper(size, device, torch.float16)
        tok = whisper_tokenizer(model.dims.n_vocab)
        for batch in args.batches:
            decoders = {name: WindowDecoder(model, tok, device, buckets=(batch,), decode_loop=loop)
                        for name, loop in (("device loop", "device"), ("K-step", "kstep"))}
            features = model.encoder(torch.randn(batch, model.dims.n_mels, 3000, device=device, dtype=torch.float16))
            requests, suppress = forced_requests(tok, batch, args.steps)
            rows = {name: [] for name in decoders}
            for name, decoder in decoders.items():
                timed_call(decoder, features, requests, suppress)  # capture, warm-up
            for _ in range(args.repeats):
                for name, decoder in decoders.items():
                    rows[name].append(timed_call(decoder, features, requests, suppress))
            for name, calls in rows.items():
                med = {k: statistics.median(c[k] for c in calls) for k in calls[0]}
                print(f"{size:<9}{batch:>4}  {name:<12}{med['total']:>10.2f}{med['start']:>8.2f}{med['admit']:>8.2f}"
                      f"{med['loop']:>8.2f}{med['launches']:>10.0f}", flush=True)
            del decoders
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
