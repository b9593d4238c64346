"""Copy openai-whisper (pure Python) from this environment into .carry/pylib/ for the GPU machine.

    python dev/carry_openai_whisper.py [--with tqdm]
    # then, on the device (carry .carry/pylib):
    PYTHONPATH=src:.carry/pylib python bench/whisper_gpu.py

The GPU image has no openai-whisper and no way to install it, but it has everything ``import
whisper`` needs except that: torch, numpy, numba (whisper.timing), tiktoken (the tokenizer),
tqdm (whisper/__init__.py) and, lazily, triton. Copied here:

  whisper/         the package, with its assets (the two .tiktoken vocabularies, mel filters)
  more_itertools/  only whisper.normalizers imports it (not ``import whisper``); the image lacks it

tqdm is in the image, so it is not copied by default: a copy on PYTHONPATH would shadow the
image's own for transformers too (``--with tqdm`` copies it anyway). __pycache__ folders and
.pyc files are skipped. .carry/ is git-ignored; the folder is rebuilt from scratch on each run.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / ".carry" / "pylib"
PACKAGES = ["whisper", "more_itertools"]
OPTIONAL = ["tqdm"]


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed in this environment (pip install it here first)")
    return Path(list(spec.submodule_search_locations)[0])


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with", dest="extra", action="append", default=[], choices=OPTIONAL,
                        help="also copy this package (may be given more than once)")
    args = parser.parse_args()
    if TARGET.exists():
        shutil.rmtree(TARGET)
    TARGET.mkdir(parents=True)
    for name in PACKAGES + args.extra:
        source = package_dir(name)
        shutil.copytree(source, TARGET / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        print(f"{name:<16} {tree_bytes(TARGET / name) / 1e6:6.2f} MB  from {source}")
    print(f"{TARGET.relative_to(ROOT)}: {tree_bytes(TARGET) / 1e6:.2f} MB in all")


if __name__ == "__main__":
    main()
