"""Audio input and Whisper log-mel features."""

from ostinato.audio.decode import audio_duration, load_audio
from ostinato.audio.features import log_mel_spectrogram, mel_filters, whisper_input_features

__all__ = [
    "audio_duration",
    "load_audio",
    "log_mel_spectrogram",
    "mel_filters",
    "whisper_input_features",
]
