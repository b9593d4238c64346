"""Where one language-model decode step's GPU time goes, kernel by kernel, on CUDA.

    PYTHONPATH=src python dev/llm_step_profile.py --shape qwen3-8b --batch 1

Builds the shape with random bfloat16 weights, runs one generate call (compiles the step and
captures its graph), then times the step as a replayed CUDA graph and runs the same compiled step
eagerly under the profiler: the kernels a replay runs, summed per name over ``--steps`` steps. (A
profile of ``generate`` itself sees only part of the steps that the device loop repeats inside a
conditional graph node.)
"""
import argparse
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "src")

from ostinato import LanguageModel  # noqa: E402
from ostinato.models.llm.decoder import GenerationKey  # noqa: E402
from ostinato.testing.measure import replay_median_us  # noqa: E402
from ostinato.testing.random_llms import SHAPES, random_network  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("dev/llm_step_profile.py needs a CUDA device")
    device = torch.device("cuda")
    net = random_network(SHAPES[args.shape], device, torch.bfloat16)
    model = LanguageModel.from_network(net, max_batch_size=args.batch)
    vocab = model.config.vocab_size
    model.generate(torch.randint(0, vocab, (args.batch, args.prompt)).tolist(), max_new_tokens=16)
    decoder, key = model.decoder, GenerationKey(args.batch, False)
    decoder.state["positions"][: args.batch].fill_(args.prompt + 8)
    replay = replay_median_us(lambda: decoder.step(key), lambda: [decoder.step(key) for _ in range(4)], 15) / 4
    for _ in range(3):
        decoder.step(key)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            decoder.step(key)
        torch.cuda.synchronize()
    total, count = collections.defaultdict(float), collections.Counter()
    for event in prof.events():
        if event.device_type.name == "CUDA":
            total[event.name] += event.device_time_total
            count[event.name] += 1
    n = args.steps
    print(f"{torch.cuda.get_device_name()}, {args.shape}, batch {args.batch}: {replay:.1f} us per replayed step, "
          f"{sum(total.values()) / n:.1f} us of kernels in {sum(count.values()) / n:.0f} launches")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{t / n:9.1f} us  {count[name] / n:5.0f}x  {t / count[name]:7.2f} us each  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
