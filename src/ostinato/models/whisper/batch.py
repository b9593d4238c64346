"""Batched transcription: the windows of many audios share the decoder's rows.

Each audio runs the ordinary window loop (``transcribe_samples``: seeking, prompts, fallback,
word timestamps) in a worker thread of its own, against a proxy runner. The proxy does no model
work: it hands each request (features, encode, language detection, decode, align) to the
scheduler on the calling thread and waits. The scheduler owns the device. It encodes windows as
they are asked for, and keeps one decoder *run* full: a window that finishes
hands its rows to the next waiting window of any audio at once, so long audios, short audios and
fallback retries flow through the same rows. Requests with other search options (a fallback at a
higher temperature) wait until the current run drains, then get a run of their own.

Every result is the one the audio gets alone: each audio's windows see only their own prompts and
seeds (sampling noise is a hash of the window's seed, not a shared generator); the encoder and
the cross-attention projections run one window at a time, and every decoder operator computes a
row the same way whatever the batch size (the fused GPU kernels plan their blocks from the
weight's shape, never from the row count); and the features an audio's windows are cut from are
the same tensor values on the host as on the device.

Workers touch only host memory: the scheduler's thread is the only one that launches device
work, so graph capture never sees another thread's kernels.
"""
from __future__ import annotations

import random
import threading
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...errors import OstinatoError
from ...runtime import strict_float32
from .decoding import SearchOptions, window_seed
from .transcribe import TranscribeOptions

class _Cancelled(OstinatoError):
    """Raised in a worker whose batch stopped because another audio failed."""


class _Request:
    __slots__ = ("kind", "args", "result", "error", "ready", "worker")

    def __init__(self, worker: "_Worker", kind: str, args: tuple):
        self.worker, self.kind, self.args = worker, kind, args
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.ready = threading.Event()


class _Proxy:
    """The model as one audio's window loop sees it; every call is served by the scheduler."""

    def __init__(self, worker: "_Worker"):
        self._worker = worker
        self._seed = 0
        self._calls = 0

    def seed(self, seed: Optional[int]) -> None:
        self._seed = random.getrandbits(64) if seed is None else int(seed)
        self._calls = 0

    def features(self, samples):
        return self._worker.ask("features", samples)

    def encode(self, mel):
        return self._worker.ask("encode", mel)

    def detect_language(self, audio_features):
        return self._worker.ask("detect_language", audio_features)

    def decode(self, audio_features, requests, suppress, suppress_at_begin, options: Optional[SearchOptions] = None):
        # The seed the decoder gives a call when this audio is transcribed alone.
        if len(requests) != 1:
            raise ValueError("the batch scheduler takes one window per decode call")
        seed = window_seed(self._seed, self._calls)
        self._calls += 1
        requests = [replace(r, rng_seed=seed ^ i) for i, r in enumerate(requests)]
        return self._worker.ask(
            "decode", audio_features, requests, tuple(suppress), tuple(suppress_at_begin), options or SearchOptions()
        )

    def align(self, audio_features, sot_sequence, text_tokens, num_frames):
        return self._worker.ask("align", audio_features, sot_sequence, text_tokens, num_frames)


class _Worker(threading.Thread):
    def __init__(self, hub: "BatchTranscriber", index: int, audio, options: TranscribeOptions):
        super().__init__(name=f"ostinato-audio-{index}", daemon=True)
        self.hub, self.index, self.audio, self.options = hub, index, audio, options
        self.outcome: Any = None

    def ask(self, kind: str, *args):
        request = _Request(self, kind, args)
        self.hub.submit(request)
        request.ready.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def run(self) -> None:
        from ...audio import load_audio
        from .model import transcribe_samples

        hub = self.hub
        try:
            with torch.inference_mode():
                samples = load_audio(self.audio)
                segments, info = transcribe_samples(
                    _Proxy(self), hub.model.tokenizer, hub.model.dims, samples, self.options
                )
                self.outcome = (list(segments), info)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in this audio's place
            self.outcome = exc
        finally:
            hub.finished(self)


class BatchTranscriber:
    def __init__(self, model, batch_size: int, options: TranscribeOptions):
        self.model = model
        self.batch_size = batch_size
        self.options = options
        self._lock = threading.Condition()
        self._queue: List[_Request] = []
        self._alive = 0  # workers started and not finished
        self._waiting = 0  # of those, blocked on a request
        self._pending: List[_Request] = []  # decode requests not yet admitted
        self._run = None
        self._run_key = None
        self._slots: Dict[int, _Request] = {}
        self._failed: Optional[BaseException] = None

    # -- worker side ---------------------------------------------------------------------------
    def submit(self, request: _Request) -> None:
        with self._lock:
            if self._failed is not None:
                request.error = _Cancelled("batch stopped")
                request.ready.set()
                return
            self._queue.append(request)
            self._waiting += 1
            self._lock.notify_all()

    def finished(self, worker: _Worker) -> None:
        with self._lock:
            self._alive -= 1
            self._lock.notify_all()

    # -- scheduler side ------------------------------------------------------------------------
    def run(self, audios: list) -> list:
        # Each audio its own options object: the window loop writes the detected language into it.
        workers = [_Worker(self, i, audio, replace(self.options)) for i, audio in enumerate(audios)]
        if not workers:
            return []
        self._windows = min(self.batch_size, len(workers))
        search = max(self.options.beam_size, self.options.best_of)
        self._decoder = self.model.batch_decoder(self._windows, self._windows * search)
        waiting = list(workers)
        in_flight = 2 * self._windows  # audios started at once: enough to refill every row
        try:
            with torch.inference_mode(), strict_float32(self.model.device, self.model.dtype):
                while True:
                    while waiting and self._alive < in_flight:
                        with self._lock:
                            self._alive += 1
                        waiting.pop(0).start()
                    requests = self._next_requests()
                    if requests is None:
                        break
                    self._serve(requests)
                    self._decode()
        except BaseException as exc:
            self._stop(exc)
            raise
        for worker in workers:
            worker.join()
        outcomes = [w.outcome for w in workers]
        first_error = next((o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, _Cancelled)), None)
        if first_error is not None and not isinstance(first_error, OstinatoError):
            raise first_error  # a bug, not a bad input: never hide it in a result list
        return outcomes

    def _next_requests(self) -> Optional[List[_Request]]:
        """The requests waiting now; None when every audio is done. While the decoder has nothing
        to run, waits until every live worker is blocked, so the requests batch up."""
        with self._lock:
            decoding = self._run is not None and self._run.busy
            if not decoding and not self._pending:
                self._lock.wait_for(lambda: self._alive == self._waiting)
            if self._alive == 0 and not self._queue and not self._pending and not decoding:
                return None
            requests, self._queue = self._queue, []
            return requests

    def _answer(self, request: _Request, result=None, error: Optional[BaseException] = None) -> None:
        request.result, request.error = result, error
        with self._lock:
            self._waiting -= 1
        request.ready.set()

    def _serve(self, requests: List[_Request]) -> None:
        for r in requests:
            if r.kind == "encode":
                # One window per encoder call, as when the audio is transcribed alone: a batched
                # matrix product may round differently from a single one on the GPU, and the
                # result must not depend on which audios share the batch.
                self._answer(r, self.model.encode(r.args[0]))
            elif r.kind == "features":
                # Computed where transcribe computes them, then kept on the host for the worker.
                self._answer(r, self.model.features(*r.args).cpu())
            elif r.kind == "detect_language":
                self._answer(r, self.model.detect_language(*r.args))
            elif r.kind == "align":
                self._answer(r, self.model.align(*r.args))
            elif r.kind == "decode":
                self._pending.append(r)

    @staticmethod
    def _key(request: _Request) -> Tuple:
        _, _, suppress, suppress_at_begin, options = request.args
        return options, suppress, suppress_at_begin

    def _decode(self) -> None:
        """Admit waiting windows into free rows, advance the run once, hand back finished windows."""
        run = self._run
        if self._pending and (run is None or (not run.busy and self._key(self._pending[0]) != self._run_key)):
            self._run_key = self._key(self._pending[0])
            options, suppress, suppress_at_begin = self._run_key
            self._run = run = self._decoder.start(options, suppress, suppress_at_begin, self._windows)
        if run is None:
            return
        # Windows with other options wait for this run to drain rather than starve behind it.
        admit = []
        for r in self._pending:
            if self._key(r) != self._run_key:
                break
            if len(admit) == run.free_slots:
                break
            admit.append(r)
        if admit:
            del self._pending[: len(admit)]
            features = torch.cat([r.args[0] for r in admit])
            requests = [r.args[1][0] for r in admit]
            for slot, r in zip(run.admit(features, requests), admit):
                self._slots[slot] = r
        if run.busy:
            run.advance()
            for slot, result in run.collect().items():
                self._answer(self._slots.pop(slot), [result])

    def _stop(self, exc: BaseException) -> None:
        """Release every blocked worker after a failure in the scheduler."""
        with self._lock:
            self._failed = exc
            stranded = self._queue + self._pending + list(self._slots.values())
            self._queue, self._pending = [], []
            self._slots.clear()
        for r in stranded:
            self._answer(r, error=_Cancelled("batch stopped"))
