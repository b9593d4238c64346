"""Audio input: decode files with PyAV (bundled FFmpeg) or accept in-memory samples.

File decoding follows faster-whisper's ``decode_audio`` step for step (same resampler
settings, same frame grouping, same s16 round trip), so that the samples we produce are
bit-identical to the ones faster-whisper transcribes. A WAV file that already holds what that
path produces (16-bit PCM, mono, at the requested rate) is read directly: the same samples,
without PyAV and without its per-file cost.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import sys
import wave
from typing import BinaryIO, Optional, Union

import numpy as np

from ostinato.errors import AudioError

SAMPLE_RATE = 16000  # what every model here takes: Whisper's and NeMo's rate; decoding resamples to it

AudioSource = Union[str, os.PathLike, bytes, bytearray, BinaryIO, np.ndarray, "torch.Tensor"]  # noqa: F821

# Decoded frames are pooled into blocks of this many samples before resampling, as
# faster-whisper does; kept identical so the resampler sees the same frame boundaries.
_GROUP_SAMPLES = 500_000
# A 2-D array with at most this many rows is read as (channels, samples) and averaged.
_MAX_CHANNELS = 8


def load_audio(source: AudioSource, sampling_rate: int = SAMPLE_RATE, check_finite: bool = True) -> np.ndarray:
    """Return the audio in ``source`` as a 1-D float32 mono array at ``sampling_rate`` Hz.

    ``source`` is a path, the bytes of an audio/video file, a binary file object, or the
    samples themselves as a numpy array or torch tensor. In-memory samples are taken to be
    mono and already at ``sampling_rate``: float arrays are used as is (cast to float32),
    int16 arrays are scaled by 1/32768, and a ``(channels, samples)`` array is averaged.
    Files in any format FFmpeg reads are mixed down to mono and resampled.

    Raises ``AudioError`` when the input is missing, not decodable, or holds no samples, and when
    in-memory samples hold NaN or infinite values unless ``check_finite`` is false (a caller that
    checks them itself, on the device, where a batch's check costs nothing).
    """
    if isinstance(source, np.ndarray):
        return _from_array(source, "numpy array", check_finite)
    torch = sys.modules.get("torch")  # a tensor can only exist if torch is imported
    if torch is not None and isinstance(source, torch.Tensor):
        tensor = source.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.float()  # numpy has no bfloat16
        return _from_array(tensor.numpy(), "torch tensor", check_finite)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(io.BytesIO(bytes(source)), "<bytes>", sampling_rate)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise AudioError(f"audio file not found: {path}")
        if os.path.isdir(path):
            raise AudioError(f"audio path is a directory, not a file: {path}")
        return _decode(path, path, sampling_rate)
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        return _decode(source, str(name) if name else "<file object>", sampling_rate)
    raise AudioError(
        f"unsupported audio input of type {type(source).__name__}: "
        "give a path, bytes, a binary file object, a numpy array or a torch tensor"
    )


def audio_duration(samples, sampling_rate: int = SAMPLE_RATE) -> float:
    """Duration in seconds of a 1-D array or tensor of samples."""
    return float(samples.shape[-1]) / sampling_rate


def length_hint(source: AudioSource) -> int:
    """How long ``source`` probably is, without reading it, to order work by: the sample count of
    in-memory samples, the byte size of bytes and of a file; 0 when unknown (a file object, a
    missing path). Only comparable between sources of one kind."""
    shape = getattr(source, "shape", None)
    if shape is not None:
        return int(shape[-1]) if len(shape) else 0
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            return os.path.getsize(source)
        except OSError:
            return 0  # its worker reports what is wrong with it
    return 0


def _from_array(array: np.ndarray, what: str, check_finite: bool = True) -> np.ndarray:
    if array.ndim == 2:
        channels, length = array.shape
        if channels == 1:
            array = array[0]
        elif channels <= _MAX_CHANNELS and length > channels:
            # Convert before averaging so int16 input cannot overflow.
            array = _to_float(array, what).mean(axis=0, dtype=np.float32)
        else:
            raise AudioError(
                f"expected mono audio, got a {what} of shape {tuple(array.shape)}: "
                "pass a 1-D array of samples or a (channels, samples) array"
            )
    elif array.ndim != 1:
        raise AudioError(f"expected a 1-D {what} of mono samples, got shape {tuple(array.shape)}")
    array = _to_float(array, what)
    if array.size == 0:
        raise AudioError(f"the {what} holds no audio samples")
    if check_finite and not np.isfinite(array).all():
        raise AudioError(f"the {what} contains NaN or infinite samples")
    return np.ascontiguousarray(array)


def _to_float(array: np.ndarray, what: str) -> np.ndarray:
    if array.dtype == np.int16:
        # Same scaling as the s16 decode path below.
        return array.astype(np.float32) / 32768.0
    if np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float32, copy=False)
    raise AudioError(f"unsupported sample type {array.dtype} in {what}: use float32 or int16")


def _open(av, file):
    # Undecodable metadata must not stop the audio: PyAV before 19 is told so, 19 and later skip it
    # by itself and no longer take the argument.
    try:
        return av.open(file, mode="r", metadata_errors="ignore")
    except TypeError:
        return av.open(file, mode="r")


def _plain_wav(file, sampling_rate: int) -> Optional[np.ndarray]:
    """The samples of a 16-bit PCM mono WAV at ``sampling_rate`` (PyAV's resampler would pass them
    through unchanged), or None for anything else, which PyAV then decodes. A file object is left
    where it was found."""
    if hasattr(file, "seek"):
        if not file.seekable():
            return None
        start = file.tell()
    try:
        with wave.open(file if hasattr(file, "read") else os.fspath(file), "rb") as reader:
            if (reader.getsampwidth(), reader.getnchannels(), reader.getframerate(), reader.getcomptype()) != (
                    2, 1, sampling_rate, "NONE"):
                return None
            data = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, OSError):
        return None
    finally:
        if hasattr(file, "seek"):
            file.seek(start)
    pcm = np.frombuffer(data, dtype="<i2", count=len(data) // 2)  # a cut-off last sample is dropped
    if pcm.size == 0:
        return None  # PyAV says why
    return pcm.astype(np.float32) / 32768.0


def _decode(file, name: str, sampling_rate: int) -> np.ndarray:
    samples = _plain_wav(file, sampling_rate)
    if samples is not None:
        return samples
    import av  # lazy: importing ostinato must not require PyAV

    # s16 (not flt) on purpose: faster-whisper resamples to int16 and scales back by
    # 1/32768, and we want the very same samples.
    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=sampling_rate)
    chunks = []
    try:
        with _open(av, file) as container:
            if not container.streams.audio:
                raise AudioError(f"no audio stream in {name}")
            frames = _grouped(_valid_frames(container.decode(audio=0), av), av)
            # A trailing None flushes the samples the resampler still holds.
            for block in itertools.chain(frames, [None]):
                for frame in resampler.resample(block):
                    chunks.append(frame.to_ndarray().reshape(-1))
    except AudioError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise AudioError(f"cannot decode audio from {name}: {_first_line(exc)}") from None
    finally:
        # PyAV keeps resampler objects alive in reference cycles; free them now.
        del resampler
        gc.collect()

    if not chunks or sum(c.size for c in chunks) == 0:
        raise AudioError(f"no audio samples decoded from {name} (empty audio)")
    return np.concatenate(chunks).astype(np.float32) / 32768.0


def _valid_frames(frames, av):
    """Yield decoded frames, stopping quietly at corrupt data (a truncated file keeps the
    audio decoded before the damage, as in faster-whisper)."""
    iterator = iter(frames)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except av.error.InvalidDataError:
            continue


def _grouped(frames, av):
    """Pool frames into blocks of about ``_GROUP_SAMPLES`` samples through a FIFO."""
    fifo = av.audio.fifo.AudioFifo()
    for frame in frames:
        frame.pts = None  # the FIFO would otherwise reject gaps in timestamps
        fifo.write(frame)
        if fifo.samples >= _GROUP_SAMPLES:
            yield fifo.read()
    if fifo.samples > 0:
        yield fifo.read()


def _first_line(exc: BaseException) -> str:
    # FFmpeg errors carry a short reason in strerror; str() adds errno and file name.
    text = getattr(exc, "strerror", None) or str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
