"""A fresh process's load and first transcript, with the load's helper thread on a timeline (issue 16).

    PYTHONPATH=src:dev python dev/load_ab.py [--model PATH | --size tiny] --clips DIR [--no-first-uses] [--greedy]
        [--steps-per-replay K] [--kernels-at-import] [--no-kernel-manifest]

Prints, in seconds from the start of the load: when the helpers' preparation (Triton's, CUDA's
libraries) ended, when each piece of work the model queued on it (``Helper.also``) ended, when the
main thread had the weights on the device, and when the load returned; then the first transcribe
of 15 s of bench/whisper_e2e.py's long recording (the defaults, as its time-to-first-transcript
table; ``--greedy``: greedy) and the same again. ``--no-first-uses`` drops the model's queued work
(the A/B: run both in turn, each a fresh process, on one machine); ``--no-kernel-manifest`` likewise
for the kernels a load brings back from earlier processes (``ops.kernel_manifest``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: random weights of --size, saved once under /tmp")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--clips", required=True)
    parser.add_argument("--no-first-uses", action="store_true")
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--kernels-at-import", action="store_true",
                        help="import Triton and the model's kernel modules with ostinato, as before f0b7684")
    parser.add_argument("--steps-per-replay", type=int, default=None, help="default: the model's own choice")
    parser.add_argument("--skip", nargs="*", default=[], help="names of queued work to drop (e.g. _encode_silence)")
    parser.add_argument("--no-kernel-manifest", action="store_true",
                        help="the load brings back no kernels of earlier processes (OSTINATO_NO_KERNEL_MANIFEST=1)")
    args = parser.parse_args()
    if args.no_kernel_manifest:
        import os

        os.environ["OSTINATO_NO_KERNEL_MANIFEST"] = "1"
    t0 = time.perf_counter()
    import torch

    from ostinato import WhisperModel
    from ostinato.models.whisper import model as whisper_model
    from ostinato.runtime import preparation
    from whisper_e2e import load_clips, long_recording

    if args.kernels_at_import:
        import importlib

        for name in whisper_model.KERNEL_MODULES:
            importlib.import_module(name)
    t_import = time.perf_counter() - t0
    marks = []
    from ostinato.ops import triton_support

    also, place = preparation.Helper.also, whisper_model.place_module

    def timed(label, fn):
        def run(*a, **k):
            out = fn(*a, **k)
            marks.append((label, time.perf_counter()))
            return out
        return run

    triton_support.prepare = timed("helper: Triton's preparation", triton_support.prepare)
    import logging

    logging.basicConfig(level=logging.WARNING, format="  %(message)s")  # prepare's own split of its time
    logging.getLogger(triton_support.__name__).setLevel(logging.DEBUG)
    from ostinato.ops import kernel_manifest

    preload = kernel_manifest.preload

    def counted_preload(name, device):
        count = preload(name, device)
        marks.append((f"helper: {count} kernels of earlier processes preloaded", time.perf_counter()))
        return count

    kernel_manifest.preload = counted_preload
    preparation.load_cuda_libraries = timed("helper: CUDA's libraries", preparation.load_cuda_libraries)
    if args.no_first_uses:
        preparation.Helper.also = lambda self, work: None
    else:
        def queued(self, work):
            name = getattr(getattr(work, "func", work), "__name__", "work")
            if name not in args.skip:
                also(self, timed("helper: " + name, work))

        preparation.Helper.also = queued
    whisper_model.place_module = timed("main: weights placed", place)
    clip = long_recording(load_clips(args.clips), 20)[: 15 * 16000]
    if args.model is None:
        args.model = f"/tmp/ostinato-random-{args.size}.pt"
        if not Path(args.model).exists():
            from ostinato.testing.random_models import save_random_whisper_checkpoint

            save_random_whisper_checkpoint(args.size, args.model)
    begin = time.perf_counter()
    model = WhisperModel(args.model, device="cuda", steps_per_replay=args.steps_per_replay)
    torch.cuda.synchronize()
    loaded = time.perf_counter()
    options = dict(beam_size=1, temperature=0.0) if args.greedy else {}
    list(model.transcribe(clip, **options)[0])
    torch.cuda.synchronize()
    first = time.perf_counter()
    list(model.transcribe(clip, **options)[0])
    torch.cuda.synchronize()
    again = time.perf_counter()
    what = "without" if args.no_first_uses else "with" + (f" (less {' '.join(args.skip)})" if args.skip else "")
    when = "with ostinato" if args.kernels_at_import else "on the load's helper"
    print(f"{what} the model's first uses, {model.steps_per_replay} steps a trip, kernel modules imported {when}; "
          f"imports {t_import:.2f} s")
    for label, at in sorted(marks, key=lambda m: m[1]):
        print(f"  {at - begin:6.3f}  {label}")
    print(f"  {loaded - begin:6.3f}  load returned")
    print(f"load {loaded - begin:.3f} s, first transcribe {first - loaded:.3f} s, again {again - first:.3f} s, "
          f"load + first {first - begin:.3f} s")


if __name__ == "__main__":
    main()
