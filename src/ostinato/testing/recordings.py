"""Long recordings with pauses and noise, built from the short test clips (tests/data/clips).

The VAD tests, their reference script (dev/make_vad_refs.py) and the VAD benchmark need minutes
(or an hour) of speech with silences of many lengths between the utterances, background noise
and bursts of noise that are not speech. Rather than commit such files, they are built from the
committed clips by a *plan*: clips, pauses and noise bursts in order, over a faint noise floor
(so no stretch is digital silence). Everything is deterministic: the clips decode to the same
samples everywhere, the noise comes from numpy's legacy ``RandomState`` (whose streams numpy
keeps fixed) and the mixing is elementwise float32 arithmetic. ``fingerprint`` hashes the result,
so a reference can tell that it was made from the same audio.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from ..audio import SAMPLE_RATE, load_audio

CLIP_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "clips"
FLOOR = 3e-4  # the noise floor's standard deviation (about -70 dBFS): quiet, never digital silence

# A step of a plan: ("clip", file name), ("pause", seconds) or ("noise", seconds, standard deviation).
Step = Tuple[Union[str, float], ...]
PLANS: Dict[str, List[Step]] = {
    # Short and long pauses (under and over faster-whisper's 2-s and 160-ms VAD silences), a noise
    # burst between two pauses, a noisy clip, speech that starts 1.5 s in.
    "pauses": [
        ("pause", 1.5), ("clip", "c02_numbers.flac"), ("pause", 3.0), ("clip", "c08_story_long.flac"),
        ("pause", 0.8), ("clip", "c09_fast_caribbean.flac"), ("pause", 2.5), ("noise", 1.5, 0.05),
        ("pause", 2.5), ("clip", "c10_slow_rp.flac"), ("pause", 5.0), ("clip", "c13_nyc_white15.flac"),
        ("pause", 1.2), ("clip", "c03_questions_f3.flac"), ("pause", 0.4), ("clip", "c04_names_rp.flac"),
        ("pause", 6.0), ("clip", "c14_klatt_mixed.flac"), ("pause", 2.0),
    ],
    # Long stretches of speech (over 30 s without a pause), then noisy speech and a quieter voice.
    "lecture": [
        ("pause", 0.6), ("clip", "c18_long_lecture.flac"), ("pause", 4.0), ("noise", 0.7, 0.02),
        ("pause", 1.0), ("clip", "c19_long_noisy_f4.flac"), ("pause", 2.0), ("clip", "c07_brown5_f2.flac"),
        ("pause", 1.5),
    ],
}


def build(plan: Union[str, Sequence[Step]], seed: int = 0, clip_dir: Union[str, Path] = CLIP_DIR,
          repeat: int = 1) -> np.ndarray:
    """The recording of ``plan`` (a name from PLANS, or steps) as 16-kHz float32 samples;
    ``repeat`` plays the plan that many times over (each time with fresh noise)."""
    steps = list(PLANS[plan] if isinstance(plan, str) else plan)
    rng = np.random.RandomState(seed)
    clips: Dict[str, np.ndarray] = {}
    parts: List[np.ndarray] = []
    for _ in range(repeat):
        for step in steps:
            kind = step[0]
            if kind == "clip":
                name = str(step[1])
                if name not in clips:
                    clips[name] = _clip(Path(clip_dir), name)
                parts.append(clips[name])
            elif kind == "pause":
                parts.append(np.zeros(_samples(step[1]), dtype=np.float32))
            elif kind == "noise":
                parts.append((rng.standard_normal(_samples(step[1])) * float(step[2])).astype(np.float32))
            else:
                raise ValueError(f"unknown step {step!r}")
    audio = np.concatenate(parts).astype(np.float32)
    floor = (rng.standard_normal(audio.shape[0]) * FLOOR).astype(np.float32)
    return np.clip(audio + floor, -1.0, 1.0).astype(np.float32)


def _clip(clip_dir: Path, name: str) -> np.ndarray:
    """A clip's samples: the file itself, or, where it is absent, ``<stem>.npy`` beside it (int16
    PCM, which dev/export_device_bundle.py writes for machines without an audio decoder)."""
    path = clip_dir / name
    pcm = clip_dir / (Path(name).stem + ".npy")
    if not path.exists() and pcm.exists():
        return (np.load(pcm).astype(np.float64) / 32768.0).astype(np.float32)
    return load_audio(str(path))


def _samples(seconds) -> int:
    return int(round(float(seconds) * SAMPLE_RATE))


def fingerprint(samples: np.ndarray) -> str:
    """sha256 of the float32 samples: equal fingerprints, equal audio."""
    return hashlib.sha256(np.ascontiguousarray(samples, dtype=np.float32).tobytes()).hexdigest()
