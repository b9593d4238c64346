"""Whisper's log-mel spectrogram, computed with torch on any device.

The numbers follow faster-whisper's numpy ``FeatureExtractor`` (itself a port of
openai-whisper's ``log_mel_spectrogram``): float32 samples, 400-point periodic Hann
window, hop 160, centred frames with reflect padding, power spectrum, Slaney mel
filterbank, log10, dynamic range clamped to 8 (80 dB), then scaled to about [-1, 1].
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ostinato.audio.decode import SAMPLE_RATE
from ostinato.errors import AudioError
from ostinato.runtime.uploads import host_tensor_to_device

N_FFT = 400  # samples per STFT frame (25 ms)
HOP_LENGTH = 160  # samples between frames (10 ms)
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # feature frames per second of audio

_FFT_BLOCK = 2048  # frames per FFT block (~20 s of audio): its float64 temporaries are ~20 MB

_filter_cache: dict = {}
_window_cache: dict = {}


def _hz_to_mel(hz: float) -> float:
    """Slaney's mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above
    (27 mel per factor 6.4 in frequency)."""
    if hz < 1000.0:
        return 3.0 * hz / 200.0
    return 15.0 + 27.0 * math.log(hz / 1000.0) / math.log(6.4)


def _mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    linear = mels * (200.0 / 3.0)
    logarithmic = 1000.0 * torch.exp((math.log(6.4) / 27.0) * (mels - 15.0))
    return torch.where(mels >= 15.0, logarithmic, linear)


def mel_filters(
    n_mels: int, n_fft: int = N_FFT, sampling_rate: int = SAMPLE_RATE, device=None
) -> torch.Tensor:
    """Slaney-normalised triangular mel filterbank, float32 ``[n_mels, 1 + n_fft // 2]``.

    Equal to ``librosa.filters.mel(sr=sampling_rate, n_fft=n_fft, n_mels=n_mels)`` (Slaney
    mel scale, ``norm="slaney"``, fmin 0, fmax sampling_rate / 2), which is what Whisper
    uses with 80 or 128 bins. Computed in float64, then rounded once to float32.
    """
    device = torch.device(device if device is not None else "cpu")
    key = (int(n_mels), int(n_fft), int(sampling_rate), device)
    cached = _filter_cache.get(key)
    if cached is not None:
        return cached

    f64 = torch.float64
    fft_freqs = torch.arange(n_fft // 2 + 1, dtype=f64) * (sampling_rate / n_fft)
    # n_mels + 2 band edges evenly spaced in mel; filter i rises from edge i to its peak
    # at edge i + 1 and falls to zero at edge i + 2.
    edges = _mel_to_hz(torch.linspace(0.0, _hz_to_mel(sampling_rate / 2), n_mels + 2, dtype=f64))
    widths = edges.diff()
    offsets = edges[:, None] - fft_freqs[None, :]
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(rising, falling), min=0.0)
    # Slaney normalisation: every filter gets unit area in Hz, so that wide high bands do
    # not dominate.
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]

    filters = weights.to(torch.float32).to(device)
    _filter_cache[key] = filters
    return filters


def _hann_window(n_fft: int, device: torch.device) -> torch.Tensor:
    # Periodic Hann computed in float64 and rounded once, like numpy's
    # np.hanning(n_fft + 1)[:-1].astype("float32") in faster-whisper.
    key = (n_fft, device)
    if key not in _window_cache:
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        _window_cache[key] = window.to(torch.float32).to(device)
    return _window_cache[key]


def _as_tensor(audio, device) -> torch.Tensor:
    if isinstance(audio, torch.Tensor):
        tensor = audio
    else:
        array = np.ascontiguousarray(audio, dtype=np.float32)
        if not array.flags.writeable:  # torch.from_numpy warns on read-only arrays
            array = array.copy()
        tensor = torch.from_numpy(array)
    if tensor.ndim != 1:
        raise AudioError(f"expected 1-D audio samples, got shape {tuple(tensor.shape)}")
    if device is not None:
        tensor = host_tensor_to_device(tensor, device)  # not waiting for the device's queued work
    return tensor.to(torch.float32)


def _reflect_pad(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Reflect-pad both ends by ``pad`` samples, as ``np.pad(mode="reflect")`` does.

    torch's reflect pad needs ``pad < len(x)``; numpy instead keeps reflecting back and
    forth, so clips shorter than ``pad + 1`` samples use explicit indices.
    """
    n = x.shape[0]
    if n > pad:
        return F.pad(x[None, None], (pad, pad), mode="reflect")[0, 0]
    if n == 1:
        return x.expand(n + 2 * pad).clone()
    period = 2 * (n - 1)
    index = torch.arange(-pad, n + pad, device=x.device).remainder(period)
    index = torch.where(index >= n, period - index, index)
    return x[index]


def _mel_power(frames: torch.Tensor, window: torch.Tensor, filters: torch.Tensor,
               whole_blocks: bool = False) -> torch.Tensor:
    """``filters @ |rfft(frame * window)|^2`` for each row of ``frames``: float32 ``[n_mels, n_frames]``.

    The windowed frames are rounded to float32 as in faster-whisper, but the FFT runs in
    float64 and is rounded once to complex64. numpy's float32 FFT is almost exactly
    rounded, while torch's float32 FFTs (MKL, cuFFT) are ~3x less accurate: a float32 FFT
    here left differences up to ~3e-5 in the log-mel output, float64 leaves ~1e-7.
    Frames go through in blocks, each to its mel bins at once: the float64 temporaries and
    the power spectrum exist for one block only (a 6-minute recording in one block took
    over 200 MB of them on the GPU). ``whole_blocks``: a last, short block is padded with
    zero frames to the full block, so every FFT and product has one shape whatever the
    audio's length (on CUDA a new shape costs a cuFFT plan, 0.3-0.6 ms on an H200, and a
    cuBLAS heuristic, a few ms; the first-call features time of 20 files measured the same
    with and without it, so that time goes elsewhere).
    """
    fft_dtype = torch.float32 if frames.device.type == "mps" else torch.float64  # no f64 on MPS
    mel = torch.empty(filters.shape[0], frames.shape[0], dtype=torch.float32, device=frames.device)
    for start in range(0, frames.shape[0], _FFT_BLOCK):
        block = frames[start : start + _FFT_BLOCK] * window
        count = block.shape[0]
        if whole_blocks and count < _FFT_BLOCK:
            block = F.pad(block, (0, 0, 0, _FFT_BLOCK - count))
        spectrum = torch.fft.rfft(block.to(fft_dtype), dim=-1).to(torch.complex64)
        mel[:, start : start + count] = (filters @ (spectrum.abs() ** 2).T)[:, :count]
    return mel


def log_mel_spectrogram(audio, n_mels: int = 80, padding: int = 0, device=None) -> torch.Tensor:
    """Whisper log-mel spectrogram, float32 ``[n_mels, n_frames]``.

    ``audio``: 1-D numpy array or tensor of 16 kHz samples. ``padding`` zeros are appended
    before the STFT. With ``L = len(audio) + padding`` there are ``L // 160`` frames
    (``1 + L // 160`` centred STFT frames, the last one dropped as Whisper does).
    Computes on ``device`` (default: the tensor's own device, CPU for numpy input).
    """
    x = _as_tensor(audio, device)
    if padding:
        x = F.pad(x, (0, padding))
    if x.shape[0] == 0:
        raise AudioError("cannot compute a spectrogram of empty audio")

    frames = _reflect_pad(x, N_FFT // 2).unfold(0, N_FFT, HOP_LENGTH)  # a view, no copy
    n_frames = frames.shape[0] - 1  # Whisper drops the last centred frame
    mel = _mel_power(frames[:n_frames], _hann_window(N_FFT, x.device), mel_filters(n_mels, device=x.device),
                     whole_blocks=x.device.type == "cuda")
    if n_frames == 0:
        return mel
    log_spec = torch.clamp(mel, min=1e-10).log10()
    # Keep 80 dB of dynamic range below the loudest bin of the whole input.
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def whisper_input_features(audio, n_mels: int, device=None) -> torch.Tensor:
    """The features faster-whisper's ``WhisperModel.transcribe`` computes for the audio.

    faster-whisper calls its ``FeatureExtractor`` once on the whole (decoded, optionally
    VAD-filtered) audio with its default ``padding=160``: one hop of zeros is appended, so
    for ``N`` samples the result has ``N // 160 + 1`` frames. It then treats
    ``content_frames = features.shape[-1] - 1 = N // 160`` frames as audio content, reads
    30-second windows (3000 frames) from them and zero-pads each window with
    ``pad_or_trim``. (openai-whisper instead appends 30 s of zeros and subtracts 3000
    frames; the two differ, so we follow faster-whisper.) The ``max - 8`` clamp uses the
    loudest bin of the whole input, so features must be computed over all of it at once,
    not window by window.

    Returns float32 ``[n_mels, N // 160 + 1]``.
    """
    return log_mel_spectrogram(audio, n_mels=n_mels, padding=HOP_LENGTH, device=device)
