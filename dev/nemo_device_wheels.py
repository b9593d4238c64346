"""Gather into .carry/nemo/ the wheels that NeMo 3.0.0 needs on the GPU machine, for bench/transducer_nemo.py.

    python dev/nemo_device_wheels.py                  # cp312 manylinux x86_64 wheels, as the GPU image needs
    # on the device (carry .carry/nemo; it has no network and no package index):
    pip install --no-deps --no-index --target /tmp/nemo_lib .carry/nemo/*.whl
    PYTHONPATH=src:/tmp/nemo_lib python bench/transducer_nemo.py --batches 1 32 128

    python dev/nemo_device_wheels.py --python-version 3.11 --dest /tmp/nemo311   # the same list for a local test

The list is what ``import nemo.collections.asr`` plus building, randomizing and decoding an
``EncDecRNNTBPEModel`` TDT model (the benchmark run on the CPU) loaded, by distribution, less what
the GPU image already has (its ``pip list``: torch, lightning, pytorch-lightning, torchmetrics, numba,
scipy, scikit-learn, sentencepiece, pandas, pyarrow, transformers, huggingface_hub, ...). Each entry
says which import needs it; all are imported on that path, most of them only because NeMo imports its
data loaders and training telemetry at import time (lhotse, datasets, webdataset, nv_one_logger,
pydantic): the benchmark uses none of them. Left out, as nothing on that path imports them: wandb,
aistore, smart-open, text-unidecode, whisper_normalizer, jiwer, editdistance, soxr and audioread
(librosa's resampling and file loading), pycparser (cffi needs it only to compile, soundfile's binding
is prebuilt), googleapis-common-protos, and NeMo's other extras.

lightning 2.4.0 is carried although the image has lightning 2.6.6: NeMo 3.0.0 pins lightning<=2.4.0,
and with 2.6.6 ``import nemo.collections.asr`` fails (nv_one_logger's PyTorch Lightning trainer
overrides ``Trainer.save_checkpoint`` with a signature that the ``overrides`` package rejects against
2.6.6). /tmp/nemo_lib comes first on PYTHONPATH, so NeMo sees 2.4.0; the image's pytorch_lightning
2.6.6 stays as it is. antlr4-python3-runtime 4.9.3 (omegaconf's pin) exists only as a source archive:
it is pure Python and is built into a wheel here. The folder is rebuilt from scratch on each run.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".carry" / "nemo"
LIMIT_MB = 25.0

# requirement, and the import that needs it (on the benchmark's path)
WHEELS = [
    ("nemo_toolkit==3.0.0", "nemo"),
    ("lightning==2.4.0", "nemo.core.classes (NeMo pins <=2.4.0; the image's 2.6.6 breaks nv_one_logger)"),
    ("hydra-core==1.3.2", "nemo.core.classes"),
    ("omegaconf==2.3.0", "nemo.core, hydra"),
    ("lhotse==1.33.0", "nemo.collections.asr data modules (lhotse dataloading)"),
    ("intervaltree==3.2.1", "lhotse.cut"),
    ("cytoolz==1.2.0", "lhotse.dataset.sampling"),
    ("soundfile==0.14.0", "lhotse.audio, nemo.collections.asr.parts.preprocessing.segment"),
    ("cffi==2.1.1", "soundfile (its _cffi_backend)"),
    ("librosa==0.11.0", "nemo.collections.asr.parts.preprocessing.features (mel filterbank)"),
    ("decorator==5.3.1", "librosa"),
    ("pooch==1.9.0", "librosa.util.files"),
    ("platformdirs==4.14.8", "pooch"),
    ("kaldialign==0.12.0", "nemo.collections.asr.parts.context_biasing"),
    ("datasets==5.2.0", "nemo.collections.asr.data.huggingface"),
    ("dill==0.4.1", "datasets"),
    ("multiprocess==0.70.19", "datasets"),
    ("webdataset==1.0.2", "nemo.utils, nemo.collections.asr tarred datasets"),
    ("braceexpand==0.1.7", "webdataset, nemo.collections.asr data"),
    ("nv_one_logger_core==2.3.1", "nemo.lightning.one_logger_callback (training telemetry)"),
    ("nv_one_logger_training_telemetry==2.3.1", "nemo.lightning.one_logger_callback"),
    ("nv_one_logger_pytorch_lightning_integration==2.3.1", "nemo.lightning.one_logger_callback"),
    ("overrides==7.7.0", "nv_one_logger"),
    ("StrEnum==0.4.15", "nv_one_logger"),
    ("toml==0.10.2", "nv_one_logger"),
    ("pydantic==2.14.4", "nv_one_logger"),
    ("pydantic_core==2.50.5", "pydantic"),
    ("annotated-types==0.8.0", "pydantic"),
    ("typing-inspection==0.4.5", "pydantic"),
]
# only a source archive exists: pure Python, built into a py3-none-any wheel
SOURCE_ONLY = [("antlr4-python3-runtime==4.9.3", "omegaconf (its grammar parser)")]
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"]


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def download_wheels(requirements, dest: Path, python_version: str) -> None:
    """Binary wheels of ``requirements`` (no dependencies) for the device's Python and platform into
    ``dest``, emptied first."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip("download", "--only-binary=:all:", "--python-version", python_version, *platforms, "--no-deps",
        "-d", str(dest), *requirements)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-version", default="3.12", help="the device's Python (3.12); 3.11 for a local test")
    ap.add_argument("--dest", type=Path, default=DEST)
    args = ap.parse_args()
    download_wheels([req for req, _ in WHEELS], args.dest, args.python_version)
    pip("wheel", "--no-deps", "--no-binary=:all:", "-w", str(args.dest), *(req for req, _ in SOURCE_ONLY))
    wheels = sorted(args.dest.glob("*.whl"))
    assert len(wheels) == len(WHEELS) + len(SOURCE_ONLY), [w.name for w in wheels]
    total = sum(w.stat().st_size for w in wheels) / 1e6
    for w in wheels:
        print(f"{w.stat().st_size / 1e6:7.2f} MB  {w.name}")
    print(f"{total:.2f} MB in {len(wheels)} wheels in {args.dest}")
    if total > LIMIT_MB:
        raise SystemExit(f"over the {LIMIT_MB:.0f} MB that the carry allows")


if __name__ == "__main__":
    main()
