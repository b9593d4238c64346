"""load_audio: file decoding (PyAV), in-memory samples, and every error path."""

import io
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from ostinato.audio import audio_duration, length_hint, load_audio
from ostinato.errors import AudioError

av = pytest.importorskip("av")

DATA = Path(__file__).parent / "data" / "features"


def tone(freq=440.0, rate=44100, seconds=1.0, amplitude=0.5):
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_wav(path, samples, rate=44100, channels=1):
    pcm = np.round(np.repeat(samples[:, None], channels, axis=1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


def write_with_pyav(path, samples, codec, rate=44100, channels=2):
    layout = "stereo" if channels == 2 else "mono"
    pcm = np.round(np.repeat(samples[:, None], channels, axis=1) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=layout)
        frame.rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return path


def peak_hz(samples, rate=16000):
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return np.argmax(spectrum) * rate / len(samples)


# ---- decoding ---------------------------------------------------------------------------


def test_wav_44k_stereo_resampled_to_16k(tmp_path):
    path = write_wav(tmp_path / "tone.wav", tone(seconds=1.0), rate=44100, channels=2)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 16000) <= 2
    assert audio_duration(audio) == pytest.approx(1.0, abs=1e-3)
    assert abs(peak_hz(audio) - 440.0) <= 1.0
    assert 0.45 < np.abs(audio).max() < 0.55  # stereo down-mix keeps the level


@pytest.mark.parametrize(
    "name,codec,rate,slack",
    [
        ("tone.flac", "flac", 44100, 2),
        ("tone.mp3", "mp3", 44100, 200),  # lossy codecs may add encoder delay / padding
        ("tone.ogg", "libopus", 48000, 200),
    ],
)
def test_compressed_formats(tmp_path, name, codec, rate, slack):
    path = write_with_pyav(tmp_path / name, tone(rate=rate, seconds=1.0), codec, rate=rate)
    audio = load_audio(str(path))
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 16000) <= slack
    assert abs(peak_hz(audio) - 440.0) <= 2.0


def test_audio_track_of_a_video(tmp_path):
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=25)
        video.width, video.height, video.pix_fmt = 32, 32, "yuv420p"
        audio = container.add_stream("aac", rate=48000, layout="stereo")
        picture = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
        for packet in [*video.encode(picture), *video.encode(None)]:
            container.mux(packet)
        pcm = np.round(np.repeat(tone(rate=48000)[:, None], 2, axis=1) * 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
        frame.rate = 48000
        for packet in [*audio.encode(frame), *audio.encode(None)]:
            container.mux(packet)
    samples = load_audio(path)
    assert abs(len(samples) - 16000) <= 1024  # AAC pads to whole 1024-sample frames
    assert abs(peak_hz(samples) - 440.0) <= 2.0


def test_path_bytes_and_file_object_agree(tmp_path):
    path = write_wav(tmp_path / "tone.wav", tone(rate=22050, seconds=0.5), rate=22050)
    from_path = load_audio(path)
    assert np.array_equal(load_audio(path.read_bytes()), from_path)
    with open(path, "rb") as handle:
        assert np.array_equal(load_audio(handle), from_path)
    assert np.array_equal(load_audio(io.BytesIO(path.read_bytes())), from_path)


@pytest.mark.parametrize("cut", [0, 1, 3333])
def test_plain_wav_read_directly_equals_pyav(tmp_path, cut, monkeypatch):
    # 16-bit mono WAV at 16 kHz skips PyAV; what PyAV decodes from the same file is the reference,
    # whole and with the data cut short (an odd byte count leaves half a sample)
    from ostinato.audio import decode

    rng = np.random.default_rng(cut)
    full = write_wav(tmp_path / "full.wav", rng.uniform(-0.9, 0.9, 16000 * 3).astype(np.float32), rate=16000)
    data = full.read_bytes()
    path = tmp_path / "speech.wav"
    path.write_bytes(data[: len(data) - cut])
    monkeypatch.setattr(decode, "_plain_wav", lambda file, rate: None)
    reference = load_audio(path)
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(av, "open", lambda *a, **k: calls.append(a) or pytest.fail("PyAV was used"))
    for source in (path, path.read_bytes(), io.BytesIO(path.read_bytes())):
        assert np.array_equal(load_audio(source), reference)
    assert not calls


def test_other_wavs_still_go_through_pyav(tmp_path):
    from ostinato.audio.decode import _plain_wav

    stereo = write_wav(tmp_path / "stereo.wav", tone(rate=16000), rate=16000, channels=2)
    other_rate = write_wav(tmp_path / "22k.wav", tone(rate=22050), rate=22050)
    flac = write_with_pyav(tmp_path / "tone.flac", tone(rate=16000), "flac", rate=16000, channels=1)
    for path in (stereo, other_rate, flac):
        assert _plain_wav(str(path), 16000) is None
    with open(other_rate, "rb") as handle:
        handle.seek(5)
        assert _plain_wav(handle, 16000) is None and handle.tell() == 5  # left where it was
    assert abs(len(load_audio(other_rate)) - 16000) <= 2


def test_decode_matches_faster_whisper_reference():
    # dev/make_feature_refs.py stored what faster-whisper's decode_audio returns for this
    # 44.1 kHz stereo FLAC; we must produce the very same samples.
    with np.load(DATA / "whisper_features.npz") as refs:
        expected = refs["speech_int16"].astype(np.float32) / 32768.0
        same_av = str(refs["av_version"]).split(".")[0] == av.__version__.split(".")[0]
    audio = load_audio(DATA / "speech_44k_stereo.flac")
    assert audio.shape == expected.shape
    if same_av:
        assert np.array_equal(audio, expected)
    else:  # another bundled FFmpeg may resample a little differently
        assert np.abs(audio - expected).max() < 1e-2


def test_length_hint_orders_sources_without_reading_them(tmp_path):
    short, long = tmp_path / "short.wav", tmp_path / "long.wav"
    write_wav(short, tone(seconds=0.5))
    write_wav(long, tone(seconds=2.0))
    assert length_hint(long) > length_hint(short) > 0
    assert length_hint(str(short)) == short.stat().st_size
    assert length_hint(np.zeros(320, np.float32)) == 320
    assert length_hint(np.zeros((2, 160), np.int16)) == 160  # channels first: samples per channel
    assert length_hint(torch.zeros(48)) == 48
    assert length_hint(b"\0" * 10) == 10
    assert length_hint(tmp_path / "missing.wav") == 0  # its worker reports it
    assert length_hint(io.BytesIO(b"abc")) == 0


# ---- in-memory samples ------------------------------------------------------------------


def test_float_array_passes_through():
    samples = tone(rate=16000, seconds=0.1)
    out = load_audio(samples)
    assert out.dtype == np.float32 and np.array_equal(out, samples)
    assert np.array_equal(load_audio(samples.astype(np.float64)), samples)


def test_int16_array_is_scaled():
    out = load_audio(np.array([0, 16384, -32768, 32767], dtype=np.int16))
    assert out.dtype == np.float32
    assert np.array_equal(out, np.array([0, 0.5, -1, 32767 / 32768], dtype=np.float32))


def test_channels_first_array_is_averaged():
    stereo = np.stack([np.ones(100, np.float32), np.zeros(100, np.float32)])
    assert np.allclose(load_audio(stereo), 0.5)
    assert np.array_equal(load_audio(stereo[:1]), stereo[0])
    pcm = np.full((2, 50), 32767, dtype=np.int16)  # must not overflow while averaging
    assert np.allclose(load_audio(pcm), 32767 / 32768)


def test_tensor_input():
    samples = tone(rate=16000, seconds=0.1)
    out = load_audio(torch.from_numpy(samples))
    assert isinstance(out, np.ndarray) and np.array_equal(out, samples)
    assert np.array_equal(load_audio(torch.tensor([16384], dtype=torch.int16)), [0.5])
    assert np.allclose(load_audio(torch.ones(2, 10)), 1.0)
    assert np.array_equal(load_audio(torch.full((4,), 0.5, dtype=torch.bfloat16)), [0.5] * 4)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((100, 2), np.float32),  # samples-first: ambiguous, ask for mono
        np.zeros((2, 3, 100), np.float32),
        np.zeros(0, np.float32),
        np.array([0.0, np.nan], np.float32),
        np.zeros(10, np.int32),
        torch.zeros(100, 2),
        [0.0, 0.1],
    ],
)
def test_bad_in_memory_input(bad):
    with pytest.raises(AudioError):
        load_audio(bad)


# ---- errors -----------------------------------------------------------------------------


def _raises_naming(path):
    with pytest.raises(AudioError) as info:
        load_audio(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


def test_missing_file(tmp_path):
    assert "not found" in _raises_naming(tmp_path / "nope.wav")


def test_directory(tmp_path):
    assert "directory" in _raises_naming(tmp_path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\n")
    assert "cannot decode" in _raises_naming(path)


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.mp3"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _raises_naming(path)
    with pytest.raises(AudioError):
        load_audio(path.read_bytes())


def test_truncated_header(tmp_path):
    full = write_wav(tmp_path / "full.wav", tone(seconds=0.1))
    path = tmp_path / "cut.wav"
    path.write_bytes(full.read_bytes()[:20])
    _raises_naming(path)


def test_empty_wav(tmp_path):
    path = write_wav(tmp_path / "empty.wav", np.zeros(0, np.float32))
    assert "empty" in _raises_naming(path)


def test_video_without_audio(tmp_path):
    path = tmp_path / "silent.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        picture = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(picture), *stream.encode(None)]:
            container.mux(packet)
    assert "no audio stream" in _raises_naming(path)


def test_unsupported_type():
    with pytest.raises(AudioError):
        load_audio(12345)
