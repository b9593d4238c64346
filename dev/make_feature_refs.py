"""Write the reference data that tests/test_audio.py and tests/test_features.py compare to.

faster-whisper is the independent reference: its ``decode_audio`` and numpy
``FeatureExtractor`` produce what its ``transcribe`` feeds the model. The tests do not
import faster_whisper (CI does not install it); they read what this script stores.

Needs faster-whisper, PyAV and the espeak-ng and sox command-line tools. Run from the
repository root:  python dev/make_feature_refs.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import av
import faster_whisper
import numpy as np
from faster_whisper.audio import decode_audio
from faster_whisper.feature_extractor import FeatureExtractor

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "features"
TEXT = "Ostinato: the same short pattern, repeated."


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    flac = OUT / "speech_44k_stereo.flac"
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        # espeak-ng speaks at 22.05 kHz mono; sox makes it 44.1 kHz stereo (right channel
        # at half volume so the down-mix is not a plain copy) to exercise resampling.
        subprocess.run(["espeak-ng", "-s", "190", "-w", str(wav), TEXT], check=True)
        subprocess.run(
            ["sox", str(wav), "-r", "44100", "-b", "16", str(flac), "remix", "1", "1v0.5"],
            check=True,
        )

    decoded = decode_audio(str(flac), sampling_rate=16000)
    # decode_audio goes through int16, so the samples are stored exactly as int16.
    samples = np.round(decoded * 32768.0).astype(np.int16)
    assert np.array_equal(samples.astype(np.float32) / 32768.0, decoded)

    rng = np.random.default_rng(1234)
    short = (0.1 * rng.standard_normal(150)).astype(np.float32)  # shorter than half a window
    refs = {
        "speech_int16": samples,
        "short": short,
        "fw_version": np.array(faster_whisper.__version__),
        "av_version": np.array(av.__version__),
        "numpy_version": np.array(np.__version__),
    }
    for n_mels in (80, 128):
        extractor = FeatureExtractor(feature_size=n_mels)
        refs[f"mel_filters_{n_mels}"] = extractor.mel_filters
        # What transcribe() computes (default padding=160) ...
        refs[f"speech_features_{n_mels}"] = extractor(decoded)
        refs[f"short_features_{n_mels}"] = extractor(short)
    # ... and the plain spectrogram without padding.
    refs["speech_logmel_80_nopad"] = FeatureExtractor(feature_size=80)(decoded, padding=0)

    np.savez_compressed(OUT / "whisper_features.npz", **refs)
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({total / 1024:.0f} KiB), {len(samples)} samples")


if __name__ == "__main__":
    main()
