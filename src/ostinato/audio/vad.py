"""Voice activity detection: Silero VAD v6 run the way faster-whisper 1.2.1 runs it.

faster-whisper's ``vad_filter`` finds speech with the Silero VAD model (v6.0), which its package
ships as ``assets/silero_vad_v6.onnx``; ``pip install 'ostinato[vad]'`` installs faster-whisper for
that file (and onnxruntime with it). The file is read from the package folder; faster-whisper
itself is never imported.

The model sees the audio as 512-sample windows (32 ms), each with the 64 samples before it as
context, and carries an LSTM state from window to window; it gives one speech probability per
window. Two ways to run it:

- ``onnx`` (the default): the ONNX file through onnxruntime on the CPU, all windows in one call
  as faster-whisper makes it. These are faster-whisper's own probabilities, bit for bit.
- ``torch`` (the default on CUDA when its weights are installed): the same network in plain
  PyTorch from the TorchScript weights of the ``silero-vad`` package, versions 6.0 or 6.1, which
  hold the same v6.0 network (6.2 brought a retrained one). It is not part of the extra (that
  package requires torchaudio, whose builds are pinned to one torch release): install it
  yourself beside a matching torchaudio. The short-time Fourier transform and the convolutions
  run on every window at once; only the LSTM steps through the windows. Probabilities agree with
  onnxruntime's to about 1e-5, so a window lying that close to a threshold may be judged the
  other way.

``OSTINATO_VAD_BACKEND=onnx|torch`` chooses one whatever the device.

The rest follows faster-whisper's ``vad.py``: probabilities to speech spans (``speech_spans``),
spans to audio cut into pieces of at most some duration (``collect_chunks``), and times in the
speech-only audio back to times in the recording (``TimestampMap``).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import math
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Union

import numpy as np

from ..errors import InvalidOptionError, MissingExtraError
from .decode import SAMPLE_RATE

log = logging.getLogger(__name__)

WINDOW_SAMPLES = 512  # one probability per 32 ms at 16 kHz
CONTEXT_SAMPLES = 64  # the end of the previous window, prepended to each
STATE_SIZE = 128  # the LSTM's hidden size
ONNX_FILE = "silero_vad_v6.onnx"  # in faster-whisper's assets/
TORCHSCRIPT_FILE = "silero_vad.jit"  # in silero-vad's data/ (6.0 and 6.1)
# Silero VAD v6.0 as faster-whisper 1.2.1 ships it, and as silero-vad 6.0.0 and 6.1.0 ship it.
KNOWN_SHA256 = {
    ONNX_FILE: "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
    TORCHSCRIPT_FILE: "b178b4bc39467ecd5e9eb0bc6f2fcc291c1cc1cc55a68fea8c0c2c0d5fbbe66c",
}
BACKENDS = ("onnx", "torch")
INSTALL_HINT = "pip install 'ostinato[vad]' (faster-whisper's Silero VAD model and onnxruntime)"
TORCH_HINT = "pip install 'silero-vad>=6.0,<6.2' with the torchaudio build of your torch"
# Where each backend's weights live: (package, folder in it, file).
SOURCES = {
    "onnx": ("faster_whisper", "assets", ONNX_FILE),
    "torch": ("silero_vad", "data", TORCHSCRIPT_FILE),
}


# -- options -------------------------------------------------------------------------------------
@dataclass
class VadOptions:
    """faster-whisper's ``VadOptions``: the same names, defaults and meaning."""

    threshold: float = 0.5  # a window with a speech probability at least this is speech
    neg_threshold: Optional[float] = None  # below this, silence (None: threshold - 0.15, at least 0.01)
    min_speech_duration_ms: int = 0  # shorter speech spans are dropped
    max_speech_duration_s: float = float("inf")  # longer spans are split, at a silence if there is one
    min_silence_duration_ms: int = 2000  # the silence that ends a span
    speech_pad_ms: int = 400  # spans are widened by this much on each side

    def validate(self) -> "VadOptions":
        def number(name: str, value, low: float, high: float = math.inf, low_open: bool = False) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
            if ok:
                ok = (value > low if low_open else value >= low) and value <= high
            if not ok:
                bound = f"> {low:g}" if low_open else f">= {low:g}"
                span = f"between {low:g} and {high:g}" if high != math.inf else f"a number {bound}"
                raise InvalidOptionError(f"vad_parameters: {name} must be {span}, got {value!r}")

        number("threshold", self.threshold, 0.0, 1.0)
        if self.neg_threshold is not None:
            number("neg_threshold", self.neg_threshold, 0.0, 1.0)
        number("min_speech_duration_ms", self.min_speech_duration_ms, 0.0)
        number("max_speech_duration_s", self.max_speech_duration_s, 0.0, low_open=True)
        number("min_silence_duration_ms", self.min_silence_duration_ms, 0.0)
        number("speech_pad_ms", self.speech_pad_ms, 0.0)
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if not math.isfinite(getattr(self, name)):
                raise InvalidOptionError(f"vad_parameters: {name} must be finite, got {getattr(self, name)!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


VAD_PARAMETERS = tuple(f.name for f in fields(VadOptions))


def vad_options(value: Union[None, dict, VadOptions], **overrides) -> VadOptions:
    """Checked ``VadOptions`` from ``vad_parameters`` (None, a dict of its fields, or VadOptions);
    ``overrides`` replace fields. Raises InvalidOptionError for unknown names or bad values."""
    if value is None:
        params = {}
    elif isinstance(value, VadOptions):
        params = asdict(value)
    elif isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in VAD_PARAMETERS)
        if unknown:
            raise InvalidOptionError(
                f"unknown vad_parameters: {', '.join(unknown)} (known: {', '.join(VAD_PARAMETERS)})"
            )
        params = dict(value)
    else:
        raise InvalidOptionError(f"vad_parameters must be a dict or VadOptions, got {type(value).__name__}")
    params.update(overrides)
    return VadOptions(**params).validate()


# -- where the model comes from ------------------------------------------------------------------

def _package_folder(package: str) -> Optional[Path]:
    """An installed package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _weights_path(backend: str) -> Optional[Path]:
    package, folder, name = SOURCES[backend]
    root = _package_folder(package)
    path = root / folder / name if root is not None else None
    return path if path is not None and path.is_file() else None


def onnx_available() -> bool:
    """Whether the ``onnx`` backend can run: faster-whisper's model file and onnxruntime (imports neither)."""
    return _weights_path("onnx") is not None and importlib.util.find_spec("onnxruntime") is not None


def torch_weights_available() -> bool:
    """Whether the silero-vad package's TorchScript weights (the ``torch`` backend's) are installed."""
    return _weights_path("torch") is not None


def vad_available() -> bool:
    """Whether some VAD backend can run: the extra's (onnx), or silero-vad's weights (torch)."""
    return onnx_available() or torch_weights_available()


def require_vad(option: str = "vad_filter") -> None:
    """Raise MissingExtraError (one line, with the install command) unless the VAD extra is installed."""
    if not vad_available():
        raise MissingExtraError(f"{option} needs the optional VAD extra: {INSTALL_HINT}")


def model_file(backend: str) -> Path:
    """The weights file of ``backend``; warns once if it is not the v6.0 network."""
    path = _weights_path(backend)
    if path is None:
        hint = INSTALL_HINT if backend == "onnx" else TORCH_HINT
        raise MissingExtraError(f"the VAD model for the {backend} backend is not installed: {hint}")
    _check_version(path, SOURCES[backend][0])
    return path


@functools.lru_cache(maxsize=None)
def _check_version(path: Path, package: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != KNOWN_SHA256.get(path.name):
        try:
            version = importlib.metadata.version(package.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        log.warning(
            "%s %s ships another Silero VAD model than faster-whisper 1.2.1 uses: speech timestamps "
            "may differ from faster-whisper's", package, version,
        )


# -- the network ---------------------------------------------------------------------------------

def model_windows(samples: np.ndarray) -> np.ndarray:
    """The model's input as faster-whisper builds it: [windows, 64 + 512] float32.

    The audio is zero-padded to whole windows (a full window of zeros when it already fills
    them); each window is preceded by the last 64 samples of the one before (zeros for the
    first). As in faster-whisper, the last 64 samples of the padded audio are zeroed first.
    """
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    padded = np.zeros(samples.shape[0] + WINDOW_SAMPLES - samples.shape[0] % WINDOW_SAMPLES, dtype=np.float32)
    padded[: samples.shape[0]] = samples
    padded[-CONTEXT_SAMPLES:] = 0.0
    windows = padded.reshape(-1, WINDOW_SAMPLES)
    context = np.zeros((windows.shape[0], CONTEXT_SAMPLES), dtype=np.float32)
    context[1:] = windows[:-1, -CONTEXT_SAMPLES:]
    return np.concatenate([context, windows], axis=1)


def device_windows(samples: np.ndarray, device="cpu"):
    """``model_windows(samples)`` as a torch tensor on ``device``, built there from the samples: a
    window with its context is 576 consecutive samples of the padded audio behind 64 zeros, so the
    windows are a strided view of it (the host neither builds nor uploads the window array, 12%
    larger than the audio: an hour's took 0.2 s of one core)."""
    import torch

    samples = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32).reshape(-1))
    n = samples.shape[0]
    padded = torch.zeros(CONTEXT_SAMPLES + n + WINDOW_SAMPLES - n % WINDOW_SAMPLES, device=device)
    padded[CONTEXT_SAMPLES : CONTEXT_SAMPLES + n] = samples.to(device)
    padded[-CONTEXT_SAMPLES:] = 0.0  # as faster-whisper zeroes the padded audio's last 64 samples
    return padded.unfold(0, CONTEXT_SAMPLES + WINDOW_SAMPLES, WINDOW_SAMPLES)


class OnnxSilero:
    """The ONNX network through onnxruntime on the CPU, as faster-whisper runs it (its numbers)."""

    backend = "onnx"

    def __init__(self, path: Path):
        try:
            import onnxruntime
        except ImportError:
            raise MissingExtraError(f"the VAD needs onnxruntime: {INSTALL_HINT}") from None
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])

    BLOCK = 10000  # windows per call, as faster-whisper runs them (the LSTM state carries across)

    def probabilities(self, samples: np.ndarray) -> np.ndarray:
        return self(model_windows(samples))

    def __call__(self, windows: np.ndarray) -> np.ndarray:
        h = np.zeros((1, 1, STATE_SIZE), dtype=np.float32)
        c = np.zeros((1, 1, STATE_SIZE), dtype=np.float32)
        probs = []
        for i in range(0, windows.shape[0], self.BLOCK):
            out, h, c = self.session.run(None, {"input": windows[i : i + self.BLOCK], "h": h, "c": c})
            probs.append(out.reshape(-1))
        return np.concatenate(probs).astype(np.float32, copy=False) if probs else np.zeros(0, np.float32)


class TorchSilero:
    """The same network in PyTorch from silero-vad's TorchScript weights, on any device.

    Per window: a short-time Fourier transform (a convolution with the model's basis, after
    reflecting 64 samples past the end), magnitudes, four convolutions with ReLU, down to 128
    values. Those run for many windows at once; an LSTM then steps through the windows, and a
    1x1 convolution with a sigmoid gives each window's probability.
    """

    backend = "torch"
    BLOCK = 8192  # windows per convolution batch (about 4.4 min of audio)
    STRIDES = (1, 2, 2, 1)
    LSTM_PIECE = 16384  # windows per LSTM call (8.7 minutes of audio)

    def __init__(self, path: Path, device="cpu"):
        import torch

        self.device = torch.device(device)
        weights = _silero_weights(path)
        take = lambda name: weights[name].to(self.device, torch.float32)  # noqa: E731
        self.basis = take("stft.forward_basis_buffer")  # [2 * 129, 1, 256]: real and imaginary rows
        self.convs = [(take(f"encoder.{i}.reparam_conv.weight"), take(f"encoder.{i}.reparam_conv.bias"), stride)
                      for i, stride in enumerate(self.STRIDES)]
        self.lstm = torch.nn.LSTM(STATE_SIZE, STATE_SIZE).to(self.device)
        with torch.no_grad():
            self.lstm.weight_ih_l0.copy_(take("decoder.rnn.weight_ih"))
            self.lstm.weight_hh_l0.copy_(take("decoder.rnn.weight_hh"))
            self.lstm.bias_ih_l0.copy_(take("decoder.rnn.bias_ih"))
            self.lstm.bias_hh_l0.copy_(take("decoder.rnn.bias_hh"))
        self.lstm.requires_grad_(False)
        self.out_weight, self.out_bias = take("decoder.decoder.2.weight"), take("decoder.decoder.2.bias")

    def _encode(self, x):
        import torch

        x = torch.nn.functional.pad(x, (0, CONTEXT_SAMPLES), mode="reflect")[:, None]
        conv = _conv1d_by_products if x.is_cuda else _conv1d
        spectrum = conv(x, self.basis, None, WINDOW_SAMPLES // 4, 0)
        bins = spectrum.shape[1] // 2
        real, imag = spectrum[:, :bins], spectrum[:, bins:]
        x = torch.sqrt(real * real + imag * imag)
        for weight, bias, stride in self.convs:
            x = torch.relu(conv(x, weight, bias, stride, 1))
        return x[:, :, 0]  # [windows, 128]: one frame per window is left

    def probabilities(self, samples: np.ndarray) -> np.ndarray:
        return self._run(device_windows(samples, self.device))

    def __call__(self, windows: np.ndarray) -> np.ndarray:
        import torch

        return self._run(torch.from_numpy(np.ascontiguousarray(windows)).to(self.device))

    def _run(self, x) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        from ..runtime import strict_float32

        with torch.inference_mode(), strict_float32(self.device, torch.float32):
            features = torch.cat([self._encode(x[i : i + self.BLOCK]) for i in range(0, x.shape[0], self.BLOCK)])
            # The windows as one sequence of batch 1, in pieces carrying the LSTM's state: cuDNN
            # refuses one sequence of an hour's windows (112,500; 37,500 still ran).
            pieces, state = [], None
            for i in range(0, features.shape[0], self.LSTM_PIECE):
                hidden, state = self.lstm(features[i : i + self.LSTM_PIECE, None], state)
                pieces.append(hidden)
            hidden = torch.cat(pieces)
            # The 1x1 convolution as the matrix product it is (no convolution plan for each length)
            probs = torch.sigmoid(F.linear(F.relu(hidden[:, 0]), self.out_weight[:, :, 0], self.out_bias))
            return probs.reshape(-1).float().cpu().numpy()


def _conv1d(x, weight, bias, stride: int, padding: int):
    import torch.nn.functional as F

    return F.conv1d(x, weight, bias, stride=stride, padding=padding)


def _conv1d_by_products(x, weight, bias, stride: int, padding: int):
    """``F.conv1d`` as one matrix product over every window's frames ([N, C, L] by [O, C, K]).

    On CUDA, cuDNN plans each convolution for its input shape, and the batch here is an audio's
    window count, new with nearly every audio: the VAD of bench/whisper_e2e.py's 20 audios took
    0.5-1.1 s in a process's first pass (0.27-0.34 s this way), 0.07 s either way once warm (H100).
    A matrix product has no plan to build; PyTorch's own convolution, the path without cuDNN,
    loops over the batch (30x slower)."""
    import torch.nn.functional as F

    out_channels, channels, kernel = weight.shape
    if padding:
        x = F.pad(x, (padding, padding))
    frames = x.unfold(2, kernel, stride)  # [N, C, L', K]
    n, _, length, _ = frames.shape
    columns = frames.permute(0, 2, 1, 3).reshape(n * length, channels * kernel)
    out = columns @ weight.reshape(out_channels, channels * kernel).t()
    if bias is not None:
        out = out + bias
    return out.reshape(n, length, out_channels).permute(0, 2, 1)


def _silero_weights(path: Path) -> dict:
    """The 16-kHz network's tensors from silero-vad's TorchScript file, by name under ``_model.``:
    read from the archive (9 ms), or through ``torch.jit.load`` (64-74 ms, which compiles the file's
    code) if the archive holds what the reader does not know."""
    import torch

    from .torchscript_weights import read_tensors

    try:
        tensors = read_tensors(path)
        if not all(f"_model.{name}" in tensors for name in _SILERO_TENSORS):
            log.debug("%s lacks some of the VAD's tensors: loading it with torch.jit", path)
            tensors = None
    except Exception as exc:  # noqa: BLE001 - torch.jit reads any archive it wrote
        log.debug("reading %s without torch.jit failed (%s): loading it with torch.jit", path, exc)
        tensors = None
    if tensors is None:
        with warnings.catch_warnings():  # TorchScript is deprecated in recent PyTorch; loading still works
            warnings.simplefilter("ignore", DeprecationWarning)
            tensors = torch.jit.load(str(path), map_location="cpu").state_dict()
    return {k[len("_model."):]: v for k, v in tensors.items() if k.startswith("_model.")}


_SILERO_TENSORS = ("stft.forward_basis_buffer",
                   *(f"encoder.{i}.reparam_conv.{w}" for i in range(4) for w in ("weight", "bias")),
                   "decoder.rnn.weight_ih", "decoder.rnn.weight_hh", "decoder.rnn.bias_ih", "decoder.rnn.bias_hh",
                   "decoder.decoder.2.weight", "decoder.decoder.2.bias")


def resolve_backend(backend: str, device) -> str:
    """``auto``: torch on CUDA when its weights are installed, else onnx (or torch where only its
    weights are installed). OSTINATO_VAD_BACKEND overrides ``auto``."""
    from ..settings import vad_backend

    if backend == "auto":
        backend = vad_backend() or "auto"
    if backend == "auto":
        if torch_weights_available() and (str(device).startswith("cuda") or not onnx_available()):
            return "torch"
        return "onnx"
    if backend not in BACKENDS:
        raise InvalidOptionError(f"unknown VAD backend {backend!r}: use auto, {' or '.join(BACKENDS)}")
    return backend


@functools.lru_cache(maxsize=4)
def _load(backend: str, device: str):
    require_vad()
    if backend == "onnx":
        return OnnxSilero(model_file("onnx"))
    return TorchSilero(model_file("torch"), device)


def load_vad(device="cpu", backend: str = "auto"):
    """The Silero VAD network for ``device`` (cached): ``vad(model_windows(samples)) -> probabilities``.

    ``backend``: "auto", "onnx" (onnxruntime on the CPU whatever ``device``) or "torch"."""
    backend = resolve_backend(backend, device)
    return _load(backend, "cpu" if backend == "onnx" else str(device))


def prepare_on(device) -> None:
    """Load the network the torch backend runs on ``device`` (cached for the first call) and the
    kernels its first pass launches: a model's load runs this beside its own work on a GPU. Each
    float32 kernel family PyTorch loads at its first launch, cuDNN's LSTM among them: on an H100 the
    first pass over 20 audios took 0.20 s against 0.07 s warm, and 0.07 s after this. The silence
    is a little longer than one convolution block, so that the block loop's second pass runs too.
    Nothing where that backend would not run (no silero-vad, or onnxruntime on the CPU)."""
    if resolve_backend("auto", device) != "torch":
        return
    vad = load_vad(device)
    vad.probabilities(np.zeros((TorchSilero.BLOCK + 16) * WINDOW_SAMPLES, dtype=np.float32))


def speech_probabilities(samples: np.ndarray, vad=None) -> np.ndarray:
    """One speech probability per 512-sample window of 16-kHz ``samples`` (padded as faster-whisper pads)."""
    vad = vad if vad is not None else load_vad()
    return vad.probabilities(samples)


# -- probabilities to speech spans ---------------------------------------------------------------

class Span(NamedTuple):
    start: int  # first sample
    end: int  # one past the last sample


def speech_spans(probs: Sequence[float], num_samples: int, options: VadOptions,
                 sampling_rate: int = SAMPLE_RATE) -> List[Span]:
    """faster-whisper's ``get_speech_timestamps`` from the window probabilities: speech spans in samples.

    A span opens at the first window whose probability reaches ``threshold`` and closes once the
    probability has stayed below ``neg_threshold`` for ``min_silence_duration_ms``; a span
    longer than ``max_speech_duration_s`` is cut at the last silence of at least 98 ms, or
    where it reaches the limit. Spans no longer than ``min_speech_duration_ms`` are dropped,
    and the rest widened by ``speech_pad_ms`` (half the gap when neighbours are closer).
    """
    window = WINDOW_SAMPLES
    threshold = options.threshold
    neg_threshold = options.neg_threshold
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    min_speech = sampling_rate * options.min_speech_duration_ms / 1000
    pad = sampling_rate * options.speech_pad_ms / 1000
    max_speech = sampling_rate * options.max_speech_duration_s - window - 2 * pad
    min_silence = sampling_rate * options.min_silence_duration_ms / 1000
    min_silence_at_max_speech = sampling_rate * 98 / 1000

    spans: List[List[int]] = []
    start: Optional[int] = None  # the open span's start; None: not in speech
    # Positions 0 mean "none" (as in faster-whisper): the start of a possible silence, the end
    # of the last long-enough silence, and where speech resumed after it.
    silence_start = last_silence_end = resumed_at = 0
    for i, prob in enumerate(probs):
        position = window * i
        if prob >= threshold and silence_start:
            silence_start = 0
            if resumed_at < last_silence_end:
                resumed_at = position
        if prob >= threshold and start is None:
            start = position
            continue
        if start is not None and position - start > max_speech:
            if last_silence_end:  # cut at that silence
                spans.append([start, last_silence_end])
                start = None if resumed_at < last_silence_end else resumed_at
                last_silence_end = resumed_at = silence_start = 0
            else:  # no silence to cut at: cut here
                spans.append([start, position])
                start = None
                last_silence_end = resumed_at = silence_start = 0
                continue
        if prob < neg_threshold and start is not None:
            if not silence_start:
                silence_start = position
            if position - silence_start > min_silence_at_max_speech:
                last_silence_end = silence_start
            if position - silence_start < min_silence:
                continue
            if silence_start - start > min_speech:
                spans.append([start, silence_start])
            start = None
            last_silence_end = resumed_at = silence_start = 0
            continue
    if start is not None and num_samples - start > min_speech:
        spans.append([start, num_samples])

    for i, span in enumerate(spans):
        if i == 0:
            span[0] = int(max(0, span[0] - pad))
        if i + 1 < len(spans):
            gap = spans[i + 1][0] - span[1]
            if gap < 2 * pad:  # neighbours closer than two pads share the gap
                span[1] += int(gap // 2)
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - gap // 2))
            else:
                span[1] = int(min(num_samples, span[1] + pad))
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - pad))
        else:
            span[1] = int(min(num_samples, span[1] + pad))
    return [Span(int(a), int(b)) for a, b in spans]


def speech_timestamps(samples: np.ndarray, options: VadOptions, vad=None) -> List[Span]:
    """Speech spans (in samples) of 16-kHz ``samples``: the network, then ``speech_spans``."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    return speech_spans(speech_probabilities(samples, vad), samples.shape[0], options)


# -- spans to audio, and back to the recording's times -------------------------------------------

class Chunk(NamedTuple):
    audio: np.ndarray  # the speech of its spans, joined
    offset: float  # where it starts in the speech-only audio, in seconds
    duration: float  # seconds


def collect_chunks(samples: np.ndarray, spans: Sequence[Span], max_duration: float = math.inf,
                   sampling_rate: int = SAMPLE_RATE) -> List[Chunk]:
    """The speech of ``spans`` joined into pieces of at most ``max_duration`` seconds
    (faster-whisper's ``collect_chunks``): a span that would overflow the current piece starts the
    next one (a span longer than the limit is a piece of its own; as in faster-whisper, an empty
    piece comes before it when it is the first). No spans: one empty piece."""
    if not spans:
        return [Chunk(np.zeros(0, dtype=np.float32), 0.0, 0.0)]
    chunks: List[Chunk] = []
    pieces: List[np.ndarray] = []
    size = 0  # samples in the current piece
    emitted = 0  # samples in the pieces before it
    for start, end in spans:
        if size + end - start > max_duration * sampling_rate:
            chunks.append(Chunk(_join(pieces), emitted / sampling_rate, size / sampling_rate))
            emitted += size
            pieces, size = [], 0
        pieces.append(samples[start:end])
        size += end - start
    chunks.append(Chunk(_join(pieces), emitted / sampling_rate, size / sampling_rate))
    return chunks


def _join(pieces: List[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, dtype=np.float32)


class TimestampMap:
    """Times in the speech-only audio back to times in the recording (faster-whisper's
    ``SpeechTimestampsMap``): add the silence removed before the span a time falls in, rounded to
    ``precision`` decimals."""

    def __init__(self, spans: Sequence[Span], sampling_rate: int = SAMPLE_RATE, precision: int = 2):
        self.sampling_rate, self.precision = sampling_rate, precision
        self.span_ends: List[int] = []  # each span's end, in speech-only samples
        self.silence_before: List[float] = []  # seconds removed before each span
        previous_end = removed = 0
        for start, end in spans:
            removed += start - previous_end
            previous_end = end
            self.span_ends.append(end - removed)
            self.silence_before.append(removed / sampling_rate)

    def span_index(self, time: float, is_end: bool = False) -> int:
        """The span ``time`` (speech-only seconds) falls in; an end exactly on a span's end stays in it."""
        sample = int(time * self.sampling_rate)
        if is_end and sample in self.span_ends:
            return self.span_ends.index(sample)
        return min(bisect.bisect(self.span_ends, sample), len(self.span_ends) - 1)

    def original_time(self, time: float, span_index: Optional[int] = None, is_end: bool = False) -> float:
        if span_index is None:
            span_index = self.span_index(time, is_end)
        return round(self.silence_before[span_index] + time, self.precision)


def restore_times(segments, spans: Sequence[Span], sampling_rate: int = SAMPLE_RATE):
    """Segments (and their words) from speech-only times to the recording's, lazily, as faster-whisper's
    ``restore_speech_timestamps``: each word by the span its middle falls in, a segment with words
    from its first and last word, one without from its own start and end."""
    times = TimestampMap(spans, sampling_rate)
    for segment in segments:
        if segment.words:
            for word in segment.words:
                index = times.span_index((word.start + word.end) / 2)
                word.start = times.original_time(word.start, index)
                word.end = times.original_time(word.end, index)
            segment.start = segment.words[0].start
            segment.end = segment.words[-1].end
        else:
            segment.start = times.original_time(segment.start)
            segment.end = times.original_time(segment.end, is_end=True)
        yield segment


__all__ = [
    "BACKENDS", "Chunk", "OnnxSilero", "Span", "TimestampMap", "TorchSilero", "VAD_PARAMETERS", "VadOptions",
    "collect_chunks", "load_vad", "model_windows", "require_vad", "restore_times", "speech_probabilities",
    "onnx_available", "speech_spans", "speech_timestamps", "torch_weights_available", "vad_available", "vad_options",
]
