"""Log-mel features against faster-whisper references (made by dev/make_feature_refs.py)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato.audio import log_mel_spectrogram, mel_filters, whisper_input_features
from ostinato.errors import AudioError

REFS = Path(__file__).parent / "data" / "features" / "whisper_features.npz"
# Our float64 FFT leaves ~1.2e-7 (one float32 ulp near 1) against faster-whisper's numpy.
ATOL = 2e-6


@pytest.fixture(scope="module")
def refs():
    with np.load(REFS) as data:
        return dict(data)


def speech(refs):
    return refs["speech_int16"].astype(np.float32) / 32768.0


# ---- mel filterbank -------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_reference(refs, n_mels):
    ours = mel_filters(n_mels)
    assert ours.shape == (n_mels, 201) and ours.dtype == torch.float32
    assert (ours >= 0).all()
    np.testing.assert_allclose(ours.numpy(), refs[f"mel_filters_{n_mels}"], rtol=0, atol=1e-7)


def test_mel_filters_are_cached_per_device():
    assert mel_filters(80) is mel_filters(80, device="cpu")
    assert mel_filters(80) is not mel_filters(128)


def _slaney_hz(mel):
    # Slaney mel scale written out: 200/3 Hz per mel below 15 mel (1 kHz), then a
    # factor 6.4 per 27 mel.
    return mel * 200 / 3 if mel < 15 else 1000 * 6.4 ** ((mel - 15) / 27)


@pytest.mark.parametrize("n_mels,index", [(80, 0), (80, 40), (80, 79), (128, 100)])
def test_mel_filter_peaks_by_hand(n_mels, index):
    top = 15 + 27 * math.log(8000 / 1000) / math.log(6.4)  # 8 kHz in mel, ~45.2456
    step = top / (n_mels + 1)
    lo, mid, hi = (_slaney_hz(step * (index + k)) for k in range(3))

    def weight(f):  # triangle through (lo, 0), (mid, 1), (hi, 0), area normalised
        return max(0.0, min((f - lo) / (mid - lo), (hi - f) / (hi - mid))) * 2 / (hi - lo)

    # The highest bin is one of the two 40 Hz FFT bins around the centre frequency.
    below = int(mid // 40)
    expected_bin = max((below, below + 1), key=lambda b: weight(40.0 * b))
    row = mel_filters(n_mels)[index]
    assert int(row.argmax()) == expected_bin
    assert float(row[expected_bin]) == pytest.approx(weight(40.0 * expected_bin), rel=1e-6)


def test_mel_filters_have_unit_area_in_hz():
    # Slaney normalisation: each (wide enough) triangle integrates to ~1 over Hz.
    areas = mel_filters(80).sum(dim=1) * 40.0
    assert torch.allclose(areas[50:], torch.ones(30), atol=0.02)


# ---- spectrogram ----------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_whisper_input_features_match_reference(refs, n_mels):
    ours = whisper_input_features(speech(refs), n_mels)
    ref = refs[f"speech_features_{n_mels}"]
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=ATOL)


def test_log_mel_without_padding_matches_reference(refs):
    ours = log_mel_spectrogram(speech(refs), n_mels=80)
    ref = refs["speech_logmel_80_nopad"]
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_very_short_input_matches_reference(refs, n_mels):
    # 150 + 160 samples is shorter than the 200-sample reflect pad on each side.
    ours = whisper_input_features(refs["short"], n_mels)
    np.testing.assert_allclose(ours.numpy(), refs[f"short_features_{n_mels}"], rtol=0, atol=ATOL)


def test_padding_argument_equals_explicit_zeros(refs):
    audio = speech(refs)[:8000]
    padded = np.concatenate([audio, np.zeros(160, np.float32)])
    assert torch.equal(whisper_input_features(audio, 80), log_mel_spectrogram(padded, 80))


@pytest.mark.parametrize("n", [1, 40, 159, 160, 161, 319, 320, 16000, 16001, 480000, 480159, 480160])
def test_whisper_input_features_frame_count(n):
    # faster-whisper: N // 160 + 1 frames, of which N // 160 are content frames.
    audio = np.full(n, 0.01, dtype=np.float32)
    assert whisper_input_features(audio, 80).shape == (80, n // 160 + 1)


def test_silence_is_floor_value():
    # log10 clamps at 1e-10, so silence gives (-10 + 4) / 4 everywhere.
    features = whisper_input_features(np.zeros(16000, np.float32), 80)
    assert torch.all(features == -1.5)


def test_dynamic_range_is_8_below_max(refs):
    features = whisper_input_features(speech(refs), 80)
    assert float(features.max() - features.min()) <= 2.0 + 1e-6  # 8 / 4 after scaling


def test_tensor_input_same_as_numpy(refs):
    audio = speech(refs)
    from_numpy = whisper_input_features(audio, 80)
    from_tensor = whisper_input_features(torch.from_numpy(audio), 80, device="cpu")
    assert from_tensor.device.type == "cpu"
    assert torch.equal(from_numpy, from_tensor)
    # float64 input is rounded to float32 first, as faster-whisper does.
    assert torch.equal(whisper_input_features(audio.astype(np.float64), 80), from_numpy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(refs):
    audio = torch.from_numpy(speech(refs))
    on_gpu = whisper_input_features(audio.cuda(), 128)
    assert on_gpu.is_cuda
    np.testing.assert_allclose(on_gpu.cpu().numpy(), refs["speech_features_128"], rtol=0, atol=1e-5)


def test_bad_shapes_raise():
    with pytest.raises(AudioError):
        log_mel_spectrogram(np.zeros((2, 100), np.float32))
    with pytest.raises(AudioError):
        log_mel_spectrogram(np.zeros(0, np.float32))


def test_blocks_of_frames_give_the_one_block_result(monkeypatch):
    """Frames go to their mel bins a block at a time (bounded temporaries); the blocks' seams are
    invisible: the same bits as one block over all the frames, at a block size that divides nothing."""
    import ostinato.audio.features as features

    audio = (np.random.default_rng(3).standard_normal(16000 * 47) * 0.1).astype(np.float32)
    monkeypatch.setattr(features, "_FFT_BLOCK", 1 << 30)
    whole = whisper_input_features(audio, 80)
    monkeypatch.setattr(features, "_FFT_BLOCK", 333)
    assert torch.equal(whisper_input_features(audio, 80), whole)


def test_whole_blocks_give_the_same_mel_bins():
    """On CUDA a last, short block of frames is padded to a whole block (one FFT and product shape
    for every audio length); the padding changes no frame's mel bins."""
    from ostinato.audio.features import N_FFT, _hann_window, _mel_power, mel_filters

    rng = np.random.default_rng(5)
    for frames_count in (1, 37, 2047, 2048, 2049, 4100):
        frames = torch.from_numpy((rng.standard_normal((frames_count, N_FFT)) * 0.1).astype(np.float32))
        window, filters = _hann_window(N_FFT, frames.device), mel_filters(80)
        padded = _mel_power(frames, window, filters, whole_blocks=True)
        assert padded.shape == (80, frames_count)
        assert torch.allclose(padded, _mel_power(frames, window, filters), rtol=1e-6, atol=0)
