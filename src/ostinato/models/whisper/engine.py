"""The transcription engine: the windows of many audios share the decoder's rows.

Each audio runs the ordinary window loop (``transcribe_samples``: seeking, prompts, fallback,
word timestamps) in a worker thread of its own, against a proxy runner. The proxy does no model
work: it hands each request (features, encode, language detection, decode, align) to the engine
thread and waits. The engine thread owns the device. It encodes windows as they are asked for,
and hands decode requests to the runtime's ``RowScheduler``, which keeps one decoder *run* full:
a window that finishes hands its rows to the next waiting window of any audio at once, so long
audios, short audios and fallback retries flow through the same rows. Requests with other search
options (a fallback at a higher temperature, another request's options) wait until the current
run drains, then get a run of their own. With ``critical_path_first`` (``transcribe_batch``'s
engine) the audio with the most audio still ahead of it is served first, its requests and its
windows' admission: a long recording's windows follow one another, so a batch ends when they do.

Two ways to drive it: ``run()`` on the calling thread until every submitted audio is done
(``transcribe_batch``), or ``start()`` a thread that serves submissions until ``shutdown()``
(a server). Audios can be submitted from any thread at any time; ``Job.cancel()`` frees an
audio's rows at once.

Every result is the one the audio gets alone: each audio's windows see only their own prompts and
seeds (sampling noise is a hash of the window's seed, not a shared generator); the encoder and
the cross-attention projections run one window at a time, and every decoder operator computes a
row the same way whatever the batch size (the fused GPU kernels plan their blocks from the
weight's shape, never from the row count); and the features an audio's windows are cut from are
the same tensor values on the host as on the device.

On CUDA the engine thread does not wait for the device while there is other work: features and
the encoder run on side streams of their own beside the rows' steps, and ahead of them (a more
urgent stream priority: they start a new audio's latency, and are small next to the rows' work).
Their inputs go up through pinned memory, the features come back by a copy their worker waits for.
An advance of the rows is launched and then looked at between requests; a window whose encoder
pass is through is loaded into a free row behind it (and the advance is asked to stop at its next
look at the guard), and the next advance starts as soon as the device is through. A window still
being encoded waits off the rows while they step: loaded, it would make the rows' stream wait for
its encoder pass. See ``_drive_rows``.

Workers touch only host memory and make no CUDA call: the engine thread is the only one that
launches device work or waits for it, so graph capture never sees another thread's kernels.
"""
from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ...audio import SAMPLE_RATE, load_audio
from ...audio.vad import resolve_backend
from ...errors import InvalidOptionError, OstinatoError
from ...runtime import RowScheduler, Ticket, one_cpu_thread_here, pinned_ring, strict_float32
from ...runtime.device import side_stream
from .search import SearchOptions, WindowJob, window_seed
from .options import TranscribeOptions
from .transcribe import transcribe_samples


class Cancelled(OstinatoError):
    """The audio's transcription was cancelled, or the engine stopped before it finished."""


class EngineStopped(OstinatoError):
    """The engine is shutting down and takes no new audio."""


def settle(future: Future, outcome: Any) -> None:
    """Complete ``future`` with ``outcome``: an exception is raised by ``result()``, anything else returned."""
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class _Request:
    __slots__ = ("kind", "args", "result", "error", "ready", "worker")

    def __init__(self, worker: "_Worker", kind: str, args: tuple):
        self.worker, self.kind, self.args = worker, kind, args
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.ready = threading.Event()


class _Proxy:
    """The model as one audio's window loop sees it; every call is served by the engine thread."""

    def __init__(self, worker: "_Worker"):
        self._worker = worker
        self._seed = 0
        self._calls = 0

    def seed(self, seed: Optional[int]) -> None:
        self._seed = random.getrandbits(64) if seed is None else int(seed)
        self._calls = 0

    def features(self, samples):
        return self._worker.ask("features", samples).wait()

    def encode(self, mel):
        return self._worker.ask("encode", mel)

    def detect_language(self, audio_features):
        return self._worker.ask("detect_language", audio_features)

    def decode(self, audio_features, requests, suppress, suppress_at_begin, options: Optional[SearchOptions] = None):
        # The seed the decoder gives a call when this audio is transcribed alone. A call of several
        # windows (the batched pipeline's chunks) waits for all of them; each takes rows of its own.
        seed = window_seed(self._seed, self._calls)
        self._calls += 1
        requests = [replace(r, rng_seed=seed ^ i) for i, r in enumerate(requests)]
        return self._worker.ask(
            "decode", audio_features, requests, tuple(suppress), tuple(suppress_at_begin), options or SearchOptions()
        )

    def align(self, audio_features, sot_sequence, text_tokens, num_frames):
        return self._worker.ask("align", audio_features, sot_sequence, text_tokens, num_frames)

    def speech_probabilities(self, samples):
        # onnxruntime's VAD is host work and runs here, beside other audios' workers; a VAD on
        # the GPU is the engine thread's.
        model = self._worker.engine.model
        if resolve_backend("auto", model.device) == "onnx":
            return model.speech_probabilities(samples)
        return self._worker.ask("vad", samples)


class _OnTheWay:
    """A result on its way to host memory: the engine thread queued the copy, and says when it has
    landed (``arrived``, from its own look at the copy's event: a worker makes no CUDA call, which
    could break a graph capture under way on the engine thread); the worker waits for that."""

    def __init__(self, device_tensor: torch.Tensor):
        self._landed = threading.Event()
        self._event = self._download = None
        if not device_tensor.is_cuda:
            self._host = device_tensor.cpu()
            self._landed.set()
            return
        # Through the download ring, which the worker copies out of: no block pinned per result.
        self._download = pinned_ring.download(device_tensor)
        if self._download is not None:
            self._event = self._download.event
            return
        self._host = torch.empty(device_tensor.shape, dtype=device_tensor.dtype, pin_memory=True)
        self._host.copy_(device_tensor, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def arrived(self) -> bool:
        """(The engine thread) whether the copy is done; tells the waiting worker once it is."""
        if not self._landed.is_set() and self._event.query():
            self._landed.set()
        return self._landed.is_set()

    def wait(self) -> torch.Tensor:
        self._landed.wait()
        if self._download is not None:
            return self._download.take()
        return self._host


class Job:
    """One audio submitted to the engine. ``result()`` waits for ``(segments, info)`` (segments as a
    list) or raises the audio's error; ``on_segment`` (given to ``submit``) sees each segment as its
    window finishes, on the audio's worker thread."""

    def __init__(self, engine: "TranscriptionEngine", index: int, audio, options: TranscribeOptions,
                 on_segment: Optional[Callable[[Any], None]]):
        self.engine, self.index, self.audio, self.options = engine, index, audio, options
        self.on_segment = on_segment
        self.cancelled = False
        self.future: Future = Future()

    @property
    def done(self) -> bool:
        return self.future.done()

    @property
    def outcome(self) -> Any:
        """The result, or the error in its place (None until done)."""
        if not self.future.done():
            return None
        return self.future.exception() or self.future.result()

    def result(self, timeout: Optional[float] = None) -> Tuple[list, Any]:
        return self.future.result(timeout)

    def cancel(self) -> None:
        """Stop this audio: a waiting one never starts, a running one gives its rows back at once."""
        self.engine._cancel(self)

    def _finish(self, outcome: Any) -> None:
        settle(self.future, outcome)


class _Worker(threading.Thread):
    def __init__(self, engine: "TranscriptionEngine", job: Job):
        super().__init__(name=f"ostinato-audio-{job.index}", daemon=True)
        self.engine, self.job = engine, job
        self.tickets: List[Ticket] = []  # its decode request's windows in the scheduler, if any
        self.decode_request: Optional[_Request] = None  # the request those tickets answer
        self.encoded = None  # (CUDA) an event after its last encoder pass: what its windows wait for
        self.remaining = 0.0  # seconds of its audio not transcribed yet (known once the audio is read)

    def ask(self, kind: str, *args):
        if self.job.cancelled:
            raise Cancelled("transcription cancelled")
        request = _Request(self, kind, args)
        self.engine._enqueue(request)
        request.ready.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def run(self) -> None:
        job = self.job
        outcome: Any
        one_cpu_thread_here()  # its host work must not slow the engine thread's parallel CPU ops
        try:
            with torch.inference_mode():
                samples = load_audio(job.audio)
                duration = samples.shape[0] / SAMPLE_RATE
                self.remaining = duration

                def progressed(seconds: float) -> None:
                    self.remaining = max(0.0, duration - seconds)

                segments, info = transcribe_samples(
                    _Proxy(self), self.engine.model.tokenizer, self.engine.model.dims, samples, job.options,
                    on_progress=progressed, batch_size=self.engine.windows,
                )
                collected = []
                for segment in segments:
                    collected.append(segment)
                    if job.on_segment is not None:
                        job.on_segment(segment)
                outcome = (collected, info)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in this audio's place
            outcome = exc
        self.engine._worker_finished(self, outcome)


class TranscriptionEngine:
    """Audios in, transcriptions out; their windows share ``windows`` groups of decoder rows.

    ``search``: the most rows one window may take (beam size or best_of), fixed with the state.
    """

    def __init__(self, model, windows: int, search: int, critical_path_first: bool = False):
        if windows < 1 or search < 1:
            raise InvalidOptionError("an engine needs at least one window of one row")
        self.model = model
        self.windows, self.search = int(windows), int(search)
        # Serve the audio with the most audio still ahead of it first (its requests, its windows'
        # admission): a long recording's windows follow one another, so a batch ends when its last
        # window does; a short audio loses nothing by going second. A server keeps arrival order.
        self.critical_path_first = bool(critical_path_first)
        self._decoder = model.batch_decoder(self.windows, self.windows * self.search)
        self._lock = threading.Condition()
        self._queue: List[_Request] = []  # model requests from workers, not yet served
        self._pending: List[Job] = []  # submitted audios whose worker has not started
        self._workers: Dict[Job, _Worker] = {}  # started and not finished
        self._waiting = 0  # workers blocked on a request
        self._cancels: List[Job] = []  # cancelled running jobs the engine thread must clean up after
        # decode requests: waiting, or in rows; a window's encoder output is read once it is admitted
        self._scheduler = RowScheduler(self._open_run)
        self._ids = itertools.count()
        self._accepting = True
        self._stopping = False
        self._failed: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        # Audios started at once: enough that every row has a window encoded and waiting for it.
        self.in_flight = 4 * self.windows
        self._advancing = False  # an advance of the rows was launched and not collected yet
        # On CUDA, features and the encoder run on side streams beside the rows' steps, and more
        # urgently; the decoder's stream waits for an audio's encoder pass before it reads its output.
        device = torch.device(model.device)
        cuda = device.type == "cuda"
        self._main = torch.cuda.current_stream(device) if cuda else None
        self._features = side_stream(device, "whisper features", priority=-2) if cuda else None
        self._encoder = side_stream(device, "whisper encoder", priority=-1) if cuda else None
        self._held: List[_Request] = []  # decode requests whose encoder pass the rows do not wait for
        self._returning: List[_Worker] = []  # audios whose windows the last collect finished
        self._arriving: List[_OnTheWay] = []  # features on their way to the host for their workers
        self._regroup_until = 0.0  # until when the next advance waits for their next windows

    # -- what callers use ------------------------------------------------------------------------
    def submit(self, audio, options: TranscribeOptions, on_segment: Optional[Callable[[Any], None]] = None) -> Job:
        """Queue one audio with its own (validated) options; thread-safe."""
        if options.rows_per_window > self.search:
            raise InvalidOptionError(
                f"beam_size and best_of can be at most {self.search} here, got {options.beam_size} and {options.best_of}"
            )
        with self._lock:
            if not self._accepting:
                raise EngineStopped("the engine is shutting down")
            job = Job(self, next(self._ids), audio, replace(options), on_segment)
            self._pending.append(job)
            self._start_workers_locked()  # its worker reads the audio now, not at the engine's next round
            self._lock.notify_all()
        return job

    def run(self) -> None:
        """Serve on the calling thread until every submitted audio is done."""
        self._serve(until_idle=True)

    def start(self) -> None:
        """Serve on a thread of the engine's own until ``shutdown``."""
        self._thread = threading.Thread(target=self._serve, kwargs=dict(until_idle=False), name="ostinato-engine",
                                        daemon=True)
        self._thread.start()

    def shutdown(self, drain: bool = True, timeout: Optional[float] = None) -> None:
        """Take no more audio; with ``drain`` finish every audio already submitted, else cancel them."""
        with self._lock:
            self._accepting = False
            jobs = [] if drain else list(self._pending) + list(self._workers)
        for job in jobs:
            job.cancel()
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> Dict[str, int]:
        """Audios waiting to start, audios in progress, decode windows waiting for rows, windows in rows."""
        with self._lock:
            return dict(queued=len(self._pending), running=len(self._workers),
                        waiting_windows=self._scheduler.waiting + sum(len(r.args[1]) for r in self._held),
                        busy_windows=self._scheduler.admitted)

    # -- worker side -----------------------------------------------------------------------------
    def _enqueue(self, request: _Request) -> None:
        with self._lock:
            if self._failed is not None or request.worker.job.cancelled:
                request.error = Cancelled("transcription cancelled" if self._failed is None else "engine stopped")
                request.ready.set()
                return
            self._queue.append(request)
            self._waiting += 1
            self._lock.notify_all()

    def _worker_finished(self, worker: _Worker, outcome: Any) -> None:
        with self._lock:
            self._workers.pop(worker.job, None)
            self._lock.notify_all()
        if worker.job.cancelled and not isinstance(outcome, Cancelled):
            outcome = Cancelled("transcription cancelled")
        worker.job._finish(outcome)

    def _cancel(self, job: Job) -> None:
        with self._lock:
            if job.done or job.cancelled:
                return
            job.cancelled = True
            if job in self._pending:
                self._pending.remove(job)
                job._finish(Cancelled("transcription cancelled"))
            else:
                self._cancels.append(job)  # the engine thread frees its rows
            self._lock.notify_all()

    # -- the engine thread -----------------------------------------------------------------------
    def _serve(self, until_idle: bool) -> None:
        if self._encoder is not None:
            self._main = torch.cuda.current_stream(self._encoder.device)  # this thread's: the rows step there
        try:
            with torch.inference_mode(), strict_float32(self.model.device, self.model.dtype):
                while True:
                    self._start_workers()
                    requests = self._next_requests(until_idle)
                    if requests is None:
                        break
                    self._clean_up_cancelled()
                    self._answer_all(requests)
                    self._tell_arrivals()
                    self._drive_rows()
        except BaseException as exc:
            self._stop(exc)
            raise

    def _drive_rows(self) -> None:
        """Keep the rows stepping. While an advance runs on the device, windows that wait go into free
        rows (their prefill queued behind it); once it is through, its finished windows go back to
        their audios, the rows they free are refilled, and the next advance is launched."""
        scheduler = self._scheduler
        if self._advancing:
            self._release_encoded()
            if not scheduler.ready:
                if not scheduler.admit(while_advancing=True) and not self._queue and self._nobody_can_ask():
                    # Nothing to load, no request waiting and none can come before this advance ends:
                    # the device steps, this thread is free (a first call's graph captures go here
                    # instead of on the path it waits on). While some worker is in its own work, its
                    # next request would wait for the capture (a first batch-16 call: 13-18 ms of them
                    # among the requests of its first 150 ms).
                    scheduler.use_spare_time()
                return
            self._returning = []
            scheduler.collect()
            self._advancing = False
            if self._main is not None and self._returning and scheduler.admitted <= len(self._returning):
                # The rows still stepping are no more than the windows just handed back: wait a
                # moment for those audios' next windows (an encoder pass away), so they step with
                # the others from the start instead of waiting for the next look at the guard.
                self._regroup_until = time.perf_counter() + self.REGROUP_SECONDS
        # While regrouping, the next advance waits for those audios anyway: their windows go in now
        # even if their encoder pass is still running.
        self._release_encoded(waited_for=self._returning if self._regroup_until else ())
        if self._regrouping():
            return
        if scheduler.waiting:
            scheduler.admit()
        self._advancing = scheduler.advance()

    def _nobody_can_ask(self) -> bool:
        """Every live worker waits for an answer: no request comes before one is given."""
        return self._waiting >= len(self._workers)

    # How long an advance may wait for the audios whose windows just finished (see _drive_rows).
    REGROUP_SECONDS = 0.01

    def _regrouping(self) -> bool:
        """Whether an audio just handed a finished window is still on its way to its next one."""
        if not self._returning:
            return False
        if self._regroup_until and time.perf_counter() < self._regroup_until and any(
            not w.tickets and w.job in self._workers for w in self._returning
        ):
            return True
        self._returning, self._regroup_until = [], 0.0
        return False

    def _start_workers(self) -> None:
        with self._lock:
            self._start_workers_locked()

    def _start_workers_locked(self) -> None:
        while self._pending and len(self._workers) < self.in_flight:
            job = self._pending.pop(0)
            worker = _Worker(self, job)
            self._workers[job] = worker
            worker.start()

    # How often the engine looks whether the device finished an advance, when no request wakes it.
    POLL_SECONDS = 0.0002

    def _next_requests(self, until_idle: bool) -> Optional[List[_Request]]:
        """The requests waiting now; None when there is nothing left to do. While an advance runs on
        the device, waits for a request or the advance's end, whichever comes first. While the
        decoder has nothing to run, waits until every live worker is blocked, so the requests
        batch up."""
        with self._lock:
            def ready() -> bool:
                if self._pending and len(self._workers) < self.in_flight:
                    return True  # an audio can start
                if self._cancels:
                    return True
                if self._workers:
                    return len(self._workers) == self._waiting
                return until_idle or self._stopping

            if self._advancing or self._returning or self._arriving or self._held:
                if not self._queue and not self._cancels and not (self._advancing and self._scheduler.ready):
                    self._lock.wait(self.POLL_SECONDS)
            elif self._scheduler.idle:
                self._lock.wait_for(ready)
            idle = (not self._workers and not self._pending and not self._queue and self._scheduler.idle
                    and not self._advancing and not self._arriving and not self._held)
            if idle and (until_idle or self._stopping):
                return None
            requests, self._queue = self._queue, []
            return requests

    # -- streams ---------------------------------------------------------------------------------
    @staticmethod
    def _on(stream):
        """Work on ``stream`` (a side stream on CUDA; on the CPU there is one order)."""
        return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)

    def _encoder_mark(self):
        """(CUDA) An event after the encoder pass just queued: what that audio's windows wait for."""
        if self._encoder is None:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _main_waits_for_encoder(self, worker: _Worker) -> None:
        """The decoder's stream waits for this audio's last encoder pass: not for the other audios'
        passes queued behind it."""
        if worker.encoded is not None:
            self._main.wait_event(worker.encoded)

    def _release_encoded(self, waited_for=()) -> None:
        """Hand held decode requests to the scheduler: those whose encoder pass is through, those of
        the workers in ``waited_for`` (the next advance waits for them anyway), and every one while
        no row is in use (then nothing but themselves waits for their encoder pass)."""
        if not self._held:
            return
        everything = not self._advancing and not self._scheduler.admitted
        held, self._held = self._held, []
        for r in held:
            event = r.worker.encoded
            if everything or event is None or r.worker in waited_for or event.query():
                self._main_waits_for_encoder(r.worker)
                self._submit_windows(r)
            else:
                self._held.append(r)

    def _used_on_main(self, tensor) -> None:
        """A side-stream tensor the decoder's stream reads: its memory is not reused before that read."""
        if self._main is not None and isinstance(tensor, torch.Tensor) and tensor.is_cuda:
            tensor.record_stream(self._main)

    def _clean_up_cancelled(self) -> None:
        with self._lock:
            jobs, self._cancels = self._cancels, []
        for job in jobs:
            worker = self._workers.get(job)
            if worker is not None and worker.decode_request is not None:
                request = worker.decode_request
                self._held = [r for r in self._held if r is not request]
                for ticket in worker.tickets:
                    self._scheduler.cancel(ticket)
                worker.tickets, worker.decode_request = [], None
                self._answer(request, error=Cancelled("transcription cancelled"))

    def _answer(self, request: _Request, result=None, error: Optional[BaseException] = None) -> None:
        request.result, request.error = result, error
        with self._lock:
            self._waiting -= 1
        request.ready.set()

    def _priority(self, worker: "_Worker") -> float:
        return worker.remaining if self.critical_path_first else 0.0

    def _next_to_answer(self, requests: List[_Request]) -> _Request:
        """The request to answer next. With ``critical_path_first``, the most urgent of these and of
        those that came while the earlier ones were answered (arrival order among equals): a long
        recording's encoder pass is asked for while twenty audios' features are being computed, and
        waited for the whole batch of them (30-100 ms of an H200 host) when a batch was answered
        before anything that came after it."""
        if not self.critical_path_first:
            return requests.pop(0)
        with self._lock:
            requests.extend(self._queue)
            self._queue = []
        best = max(range(len(requests)), key=lambda i: (self._priority(requests[i].worker), -i))
        return requests.pop(best)

    def _answer_all(self, requests: List[_Request]) -> None:
        """Answer as many requests as came in this batch (the rows are driven between batches), the
        next one picked by ``_next_to_answer``."""
        r = None
        try:
            for _ in range(len(requests)):
                r = self._next_to_answer(requests)
                self._answer_one(r)
            r = None
        finally:
            # Requests in hand and not answered go back to the front of the queue: those that came
            # during this batch and had no turn in it, or, after a failure, the failing one and the
            # rest (the engine's stop answers them; a held decode request it answers from the held).
            back = [q for q in [r, *requests] if q is not None and not q.ready.is_set() and q not in self._held]
            if back:
                with self._lock:
                    self._queue[:0] = back

    def _answer_one(self, r: _Request) -> None:
        model = self.model
        if self._advancing and self._scheduler.ready:
            self._drive_rows()  # the rows are through: the next advance goes before more host work
        self._tell_arrivals()  # a worker whose features landed goes on while the others are answered
        if r.worker.job.cancelled:
            self._answer(r, error=Cancelled("transcription cancelled"))
        elif r.kind == "encode":
            # One window per encoder call, as when the audio is transcribed alone: a batched
            # matrix product may round differently from a single one on the GPU, and the
            # result must not depend on which audios share the batch. (The batched pipeline
            # sends its own audio's chunks together, as transcribe(batched=True) encodes them.)
            with self._on(self._encoder):
                encoded = model.encode(r.args[0])
                r.worker.encoded = self._encoder_mark()
            self._answer(r, encoded)
        elif r.kind == "features":
            # Computed where transcribe computes them, then kept on the host for the worker, which
            # waits for the copy itself: this thread goes on.
            with self._on(self._features):
                features = _OnTheWay(model.features(*r.args))
            if not features.arrived():
                self._arriving.append(features)
            self._answer(r, features)
        elif r.kind == "detect_language":
            self._main_waits_for_encoder(r.worker)
            self._used_on_main(r.args[0])
            self._answer(r, model.detect_language(*r.args))
        elif r.kind == "align":
            self._main_waits_for_encoder(r.worker)
            self._used_on_main(r.args[0])
            self._answer(r, model.align(*r.args))
        elif r.kind == "vad":
            self._answer(r, model.speech_probabilities(*r.args))
        elif r.kind == "decode":
            r.worker.decode_request = r
            self._held.append(r)  # to the scheduler from _drive_rows (_release_encoded)

    def _tell_arrivals(self) -> None:
        """Let the workers whose features have landed on the host go on."""
        if self._arriving:
            self._arriving = [a for a in self._arriving if not a.arrived()]

    def _submit_windows(self, r: _Request) -> None:
        """A decode request's windows into the scheduler's queue."""
        features, requests_, suppress, suppress_at_begin, options = r.args
        self._used_on_main(features)
        key = (options, suppress, suppress_at_begin)  # windows with equal keys share a run
        done = self._decoded(r, len(requests_))
        priority = self._priority(r.worker)
        r.worker.tickets = [
            self._scheduler.submit(key, WindowJob(features[i : i + 1], request), done(i), priority)
            for i, request in enumerate(requests_)
        ]

    def _decoded(self, request: _Request, count: int):
        """Callbacks for the ``count`` windows of one decode request: it is answered once all are back."""
        results: List[Any] = [None] * count
        errors: List[BaseException] = []
        waiting = [count]

        def window(i: int):
            def done(result, error: Optional[BaseException]) -> None:
                if error is not None:
                    errors.append(error)
                results[i] = result
                waiting[0] -= 1
                if waiting[0] == 0 and request.worker.decode_request is request:
                    request.worker.tickets, request.worker.decode_request = [], None
                    self._returning.append(request.worker)
                    if errors:
                        self._answer(request, error=errors[0])
                    else:
                        self._answer(request, results)
            return done
        return window

    def _open_run(self, key: Tuple):
        options, suppress, suppress_at_begin = key
        return self._decoder.start(options, suppress, suppress_at_begin, self.windows)

    def _stop(self, exc: BaseException) -> None:
        """Release every blocked worker after a failure in the engine thread."""
        with self._lock:
            self._failed = exc
            self._accepting = False
            stranded, self._queue = self._queue + self._held, []
            self._held = []
            pending, self._pending = self._pending, []
        for r in stranded:
            self._answer(r, error=Cancelled("engine stopped"))
        self._scheduler.fail_all(Cancelled("engine stopped"))
        for job in pending:
            job._finish(Cancelled("engine stopped"))
