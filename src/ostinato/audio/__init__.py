"""Audio input and Whisper log-mel features."""

from ostinato.audio.decode import SAMPLE_RATE, audio_duration, length_hint, load_audio
from ostinato.audio.features import (
    FRAMES_PER_SECOND, HOP_LENGTH, N_FFT, log_mel_spectrogram, mel_filters, whisper_input_features,
)

__all__ = [
    "FRAMES_PER_SECOND",
    "HOP_LENGTH",
    "N_FFT",
    "SAMPLE_RATE",
    "audio_duration",
    "length_hint",
    "load_audio",
    "log_mel_spectrogram",
    "mel_filters",
    "whisper_input_features",
]
