"""First call against warm calls in fresh processes, source trees alternating (an A/B of a change).

    python dev/first_warm_ab.py --model DIR --clips DIR --config greedy-b16 --rounds 8 \
        --tree base=PATH/src --tree new=src [--calls 4] [--long-seconds 300] [--device cuda]

Each round runs one fresh process per tree, in alternating order, with that tree's ``src`` first on
PYTHONPATH. A process loads the model, makes ``--calls`` calls of bench/whisper_e2e.py's configuration
(its clips and long recording) and reports each call's wall, a digest of its texts, the graph
captures it made (StepGraph's debug lines, with the host time since the call began) and the
spare-time captures it put off (the device not busy long enough). The summary per tree: the first
call's median, the warm one's (best of the later calls per process), the ratio's median and range,
how many are within 1.3x, and the captures of each call index. A first call reads Triton's kernels
from a cache an untimed run of each tree filled first.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))


class CaptureLog(logging.Handler):
    """StepGraph's "captured ..." debug lines, each with the ms since the current call began."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.call_start = time.perf_counter()
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith(("captured", "spare time")):
            at = 1000 * (time.perf_counter() - self.call_start)
            self.lines.append(f"{at:.0f}ms {message.replace('captured ', '')}")


def child(args) -> None:
    import whisper_e2e as e2e
    from ostinato import WhisperModel

    handler = CaptureLog()
    graphs_log = logging.getLogger("ostinato.runtime.graphs")
    graphs_log.setLevel(logging.DEBUG)
    graphs_log.addHandler(handler)
    model = WhisperModel(args.model, device=args.device)
    audios = e2e.audio_set(args.clips, None, args.long_seconds)
    config = e2e.CONFIGS[args.config]

    def run():
        results = model.transcribe_batch(audios, batch_size=config["batch"], **config["options"])
        return [" ".join(s.text.strip() for s in segments) for segments, _ in results]

    calls = []
    for _ in range(args.calls):
        handler.lines = []
        handler.call_start = time.perf_counter()
        wall, texts = e2e.timed(run, args.device)
        calls.append(dict(wall=wall, captures=handler.lines, digest=hash(tuple(texts)) & 0xFFFFFFFF))
    print(json.dumps(calls))


def spawn(args, tree: str, calls: int):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]),
           "PYTHONHASHSEED": "0"}
    command = [sys.executable, __file__, "--child", "--model", args.model, "--clips", args.clips,
               "--config", args.config, "--calls", str(calls), "--device", args.device,
               "--long-seconds", str(args.long_seconds)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"{tree} failed:\n{done.stderr[-3000:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--clips", required=True)
    parser.add_argument("--config", default="greedy-b16")
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a src folder")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--long-seconds", type=float, default=300.0, help="the recording after the clips")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = dict(t.split("=", 1) for t in args.tree)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ab-triton-")
    for name, tree in trees.items():
        spawn(args, tree, 1)  # fills the kernel cache, untimed
    runs = {name: [] for name in trees}
    order = list(trees)
    for round_ in range(args.rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            calls = spawn(args, trees[name], args.calls)
            if calls is None:
                continue
            runs[name].append(calls)
            walls = " ".join(f"{c['wall']:.3f}" for c in calls)
            print(f"{name} round {round_}: {walls}; digests {sorted({c['digest'] for c in calls})}", flush=True)
            for index, c in enumerate(calls):
                if c["captures"]:
                    print(f"    call {index}: " + "; ".join(c["captures"]), flush=True)
    print(f"\n== {args.config}: first / warm (best of calls 2..{args.calls}) per fresh process ==")
    for name, processes in runs.items():
        if not processes:
            continue
        firsts = [p[0]["wall"] for p in processes]
        warms = [min(c["wall"] for c in p[1:]) for p in processes]
        ratios = sorted(f / w for f, w in zip(firsts, warms))
        within = sum(r <= 1.3 for r in ratios)
        captures = [statistics.mean(sum(not line.split(" ", 1)[1].startswith("spare") for line in p[i]["captures"])
                                    for p in processes) for i in range(args.calls)]
        print(f"{name}: n={len(processes)} first median {statistics.median(firsts):.3f} warm median "
              f"{statistics.median(warms):.3f} ratio median {statistics.median(ratios):.3f} range "
              f"{ratios[0]:.3f}-{ratios[-1]:.3f}; within 1.3x: {within} of {len(ratios)}; captures per call "
              + " ".join(f"{c:.1f}" for c in captures))


if __name__ == "__main__":
    main()
