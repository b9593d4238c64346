"""The served models: each owns its device work on one thread of its own; handlers only submit.

A Whisper model runs a ``TranscriptionEngine`` (every request's windows share the decoder's rows);
a transducer a small engine that takes whatever uploads wait, each round, and decodes them in one
``transcribe_batch``. Both give ``options(**fields)`` (the model's own checks, as the Python API
makes them), ``submit(audio, options, on_segment) -> job`` with ``job.future`` (a
``concurrent.futures.Future``), ``job.done``, ``job.result()`` and ``job.cancel()``, ``sample_rate``
(what uploads are decoded to), ``warm``/``warm_up()`` and ``stats()`` for the metrics.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..audio import load_audio
from ..errors import OstinatoError
from ..models.whisper.engine import Cancelled, EngineStopped, settle
from ..results import TranscriptionInfo


def _tone(sample_rate: int, seconds: float = 2.0) -> np.ndarray:
    """A short generated signal for the warm-up transcription."""
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    return (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


class WhisperService:
    family = "whisper"
    sample_rate = 16000

    def __init__(self, model, batch_size: int, max_search: int, defaults: Dict[str, Any]):
        self.model = model
        self.defaults = defaults  # the server's options (--beam-size ...), under each request's own
        self.engine = model.engine(batch_size=batch_size, max_search=max_search)
        self.engine.start()
        self.warm = False

    def options(self, **fields):
        return self.model.options(**{**self.defaults, **fields})

    def submit(self, audio, options, on_segment: Optional[Callable] = None):
        return self.engine.submit(audio, options, on_segment)

    def warm_up(self) -> None:
        """A short transcription with the server's options at temperature 0 (and a greedy one, if those
        search), so the first request pays for no graph capture or compile."""
        runs = [self.options(temperature=0.0)]
        if runs[0].rows_per_window > 1:
            runs.append(self.options(beam_size=1, best_of=1, temperature=0.0))
        for options in runs:
            self.submit(_tone(self.sample_rate), options).result(timeout=600)
        self.warm = True

    def stats(self) -> Dict[str, int]:
        return self.engine.stats()

    def shutdown(self) -> None:
        self.engine.shutdown(drain=True)


class _TransducerJob:
    def __init__(self, audio, options: dict, on_segment):
        self.audio, self.options, self.on_segment = audio, options, on_segment
        self.cancelled = False
        self.future: Future = Future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: Optional[float] = None):
        return self.future.result(timeout)

    def cancel(self) -> None:
        """A waiting upload is dropped at the next round; one being decoded finishes with its batch."""
        self.cancelled = True

    def finish(self, outcome) -> None:
        settle(self.future, outcome)


class TransducerService:
    """Uploads queue up; the engine thread decodes all that wait in one ``transcribe_batch`` per round."""

    family = "transducer"

    def __init__(self, model, batch_size: int):
        self.model, self.batch_size = model, batch_size
        self.sample_rate = model.sample_rate
        self._lock = threading.Condition()
        self._waiting: List[_TransducerJob] = []
        self._running = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="ostinato-transducer-engine", daemon=True)
        self._thread.start()
        self.warm = False

    def options(self, **fields):
        return self.model.options(**fields)  # max_symbols only: any other option is named and refused

    def submit(self, audio, options: dict, on_segment: Optional[Callable] = None):
        job = _TransducerJob(audio, options, on_segment)
        with self._lock:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            self._waiting.append(job)
            self._lock.notify_all()
        return job

    def warm_up(self) -> None:
        self.submit(_tone(self.sample_rate), {}).result(timeout=600)
        self.warm = True

    def stats(self) -> Dict[str, int]:
        with self._lock:
            return dict(queued=len(self._waiting), running=self._running, waiting_windows=0,
                        busy_windows=self._running)

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._waiting or self._stopping)
                if not self._waiting and self._stopping:
                    return
                jobs = [j for j in self._waiting if not j.cancelled]
                for j in self._waiting:
                    if j.cancelled:
                        j.finish(Cancelled("transcription cancelled"))
                self._waiting = []
                self._running = len(jobs)
            self._decode(jobs)
            with self._lock:
                self._running = 0

    def _decode(self, jobs: List[_TransducerJob]) -> None:
        ready, samples = [], []
        for job in jobs:  # each upload read on its own: a bad one fails alone
            try:
                samples.append(load_audio(job.audio, self.model.sample_rate))
                ready.append(job)
            except OstinatoError as exc:
                job.finish(exc)
        groups: Dict[Any, List[int]] = {}
        for i, job in enumerate(ready):
            groups.setdefault(job.options.get("max_symbols"), []).append(i)
        for max_symbols, members in groups.items():
            try:
                results = self.model.transcribe_batch([samples[i] for i in members], batch_size=self.batch_size,
                                                      max_symbols=max_symbols)
            except BaseException as exc:  # noqa: BLE001 - each request gets the error
                for i in members:
                    ready[i].finish(exc)
                continue
            for i, result in zip(members, results):
                # what transcribe_segments gives for the same audio alone
                segments = self.model.segments(result)
                for segment in segments:
                    if ready[i].on_segment is not None:
                        ready[i].on_segment(segment)
                info = TranscriptionInfo(
                    language="und", language_probability=1.0, duration=result.audio_duration,
                    transcription_options={"max_symbols": max_symbols or self.model.config.max_symbols,
                                           "decoding": "greedy label looping"})
                ready[i].finish((segments, info))
