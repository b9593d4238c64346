"""Transcribe a folder, a glob or a parquet file of audio with Ray Data; write parquet.

    python examples/ray_transcribe.py audio/ out/                      # a local Ray on this machine
    python examples/ray_transcribe.py 'talks/*.flac' out/ --num-gpus 1 --actors 2 --batch-size 16
    python examples/ray_transcribe.py clips.parquet out/ --address auto   # an existing Ray cluster

A parquet input needs a ``bytes``, ``audio`` (16-kHz float32) or ``path`` column. Every input row
becomes one output row with ``text``, ``language``, ``duration``, ``segments`` and ``error`` (set,
with the others empty, for a file that could not be read). Transcription options go through as
``--option NAME=VALUE`` (for example ``--option beam_size=1 --option language=en``).
"""
from __future__ import annotations

import argparse
import ast
import glob
import os
import sys

from ostinato.ray import Transcriber


def _option(text: str):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--option takes NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # a plain string, e.g. language=en


def read_inputs(source: str):
    import ray

    if source.endswith(".parquet"):
        return ray.data.read_parquet(source)
    if os.path.isdir(source):
        return ray.data.read_binary_files(source, include_paths=True)
    paths = sorted(glob.glob(source))
    if not paths:
        raise SystemExit(f"ray_transcribe: no files match {source!r}")
    return ray.data.read_binary_files(paths, include_paths=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a folder, a glob of audio files, or a .parquet file")
    parser.add_argument("output", help="a folder for the parquet output")
    parser.add_argument("--model", default=None, help="checkpoint path or id (default: the embedded tiny.en)")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor (0: CPU actors)")
    parser.add_argument("--actors", type=int, default=1, help="model replicas, one per actor")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per batch handed to an actor")
    parser.add_argument("--compute-type", default="auto")
    parser.add_argument("--address", default=None, help="an existing Ray cluster (e.g. auto, or ray://host:10001)")
    parser.add_argument("--option", type=_option, action="append", default=[], metavar="NAME=VALUE",
                        help="a transcribe option, repeatable")
    args = parser.parse_args(argv)

    import ray

    ray.init(address=args.address, ignore_reinit_error=True)
    ds = read_inputs(args.source)
    ds = ds.map_batches(
        Transcriber,
        fn_constructor_kwargs=dict(model=args.model, device="cuda" if args.num_gpus else "cpu",
                                   compute_type=args.compute_type, batch_size=args.batch_size, **dict(args.option)),
        batch_size=args.batch_size,
        concurrency=args.actors,
        num_gpus=args.num_gpus,
    )
    ds.write_parquet(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
