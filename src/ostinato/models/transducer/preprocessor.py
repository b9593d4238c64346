"""NeMo's audio preprocessor (``AudioToMelSpectrogramPreprocessor`` at inference), on the device.

Pre-emphasis, a centred STFT with zero padding, power spectrum, slaney mel filterbank, log with an
additive guard, per-feature normalization over each utterance's valid frames (unbiased std plus
1e-5), and zeros past each utterance's length. Dither is a training-time augmentation and is off.
Always computed in float32, as NeMo does (it disables autocast for these steps).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .nemo_checkpoint import PreprocessorConfig

_NORM_EPS = 1e-5  # NeMo's CONSTANT, added to the standard deviation


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asanyarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asanyarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: Optional[float] = None,
                          norm: Optional[str] = "slaney") -> np.ndarray:
    """librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm) as float32 [n_mels, n_fft//2+1]."""
    fmax = sr / 2 if fmax is None else fmax
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, len(fftfreqs)), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    if norm == "slaney":
        enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
        weights *= enorm[:, np.newaxis]
    return weights


_WINDOWS = {
    "hann": torch.hann_window,
    "hamming": torch.hamming_window,
    "blackman": torch.blackman_window,
    "bartlett": torch.bartlett_window,
}


class MelPreprocessor(nn.Module):
    def __init__(self, cfg: PreprocessorConfig, window: Optional[Tensor] = None, filterbank: Optional[Tensor] = None):
        super().__init__()
        self.cfg = cfg
        if window is None and cfg.window in _WINDOWS:
            window = _WINDOWS[cfg.window](cfg.win_length, periodic=False)
        if filterbank is None:
            filterbank = torch.from_numpy(
                slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.features, cfg.lowfreq, cfg.highfreq, cfg.mel_norm)
            )
        filterbank = filterbank.reshape(cfg.features, cfg.n_fft // 2 + 1).float()
        self.register_buffer("window", None if window is None else window.float().reshape(-1))
        self.register_buffer("filterbank", filterbank)

    def feature_lengths(self, sample_lengths: Tensor) -> Tensor:
        """Valid frames of each utterance: samples // hop (the STFT's extra centred frame is padding)."""
        return torch.div(sample_lengths, self.cfg.hop_length, rounding_mode="floor").to(torch.int64)

    @torch.no_grad()
    def forward(self, audio: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        """audio [B, N] float (zero past each length), lengths [B] -> features [B, n_mels, T] float32, [B]."""
        cfg = self.cfg
        x = audio.float()
        lengths = lengths.to(x.device, torch.int64)
        feat_len = self.feature_lengths(lengths)
        if cfg.preemph is not None:
            timemask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
            x = torch.cat((x[:, :1], x[:, 1:] - cfg.preemph * x[:, :-1]), dim=1)
            x = x.masked_fill(~timemask, 0.0)
        spec = torch.stft(
            x, n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length, center=True,
            window=self.window, return_complex=True, pad_mode="constant",
        )
        spec = torch.view_as_real(spec)
        x = torch.sqrt(spec.pow(2).sum(-1))
        if cfg.mag_power != 1.0:
            x = x.pow(cfg.mag_power)
        x = torch.matmul(self.filterbank, x)
        if cfg.log:
            if cfg.log_zero_guard_type == "add":
                x = torch.log(x + cfg.log_zero_guard_value)
            else:
                x = torch.log(torch.clamp(x, min=cfg.log_zero_guard_value))
        steps = torch.arange(x.shape[-1], device=x.device)[None, :]
        valid = steps < feat_len[:, None]
        if cfg.normalize == "per_feature":
            count = valid.sum(dim=1)
            mean = torch.where(valid[:, None], x, 0.0).sum(dim=2) / count[:, None]
            var = torch.sum(torch.where(valid[:, None], x - mean[:, :, None], 0.0) ** 2, dim=2) / (count[:, None] - 1.0)
            std = torch.sqrt(var)
            std = std.masked_fill(std.isnan(), 0.0) + _NORM_EPS
            x = (x - mean[:, :, None]) / std[:, :, None]
        x = x.masked_fill(~valid[:, None], cfg.pad_value)
        if cfg.pad_to > 0 and x.shape[-1] % cfg.pad_to:
            x = nn.functional.pad(x, (0, cfg.pad_to - x.shape[-1] % cfg.pad_to), value=cfg.pad_value)
        return x, feat_len
