"""The long-lived transcription engine a server runs: audios arrive from other threads while others
decode, each result equals ``transcribe`` alone, a cancelled audio gives its rows back at once, and
shutdown finishes what was submitted."""
import threading
import time

import pytest
import torch

from ostinato import WhisperModel
from ostinato.errors import InvalidOptionError
from ostinato.models.whisper.engine import Cancelled, EngineStopped
from ostinato.models.whisper.options import TranscribeOptions

GREEDY = dict(beam_size=1, best_of=1, temperature=0.0)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Decoding-heavy module: run it on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def model(tiny_en_path):
    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


def _texts(segments):
    return [(s.start, s.end, s.text, s.tokens) for s in segments]


def _clip(data_dir, name):
    return str(data_dir / "clips" / name)


def test_audios_submitted_from_threads_while_others_decode(model, data_dir):
    names = ("c17_cut_two_windows.flac", "c01_hello_short.flac", "c02_numbers.flac", "c05_white20_m3.flac")
    engine = model.engine(batch_size=2, max_search=1)
    engine.start()
    jobs, streamed = {}, {name: [] for name in names}

    def client(name, delay):
        time.sleep(delay)
        options = TranscribeOptions(**GREEDY)
        jobs[name] = engine.submit(_clip(data_dir, name), options, on_segment=streamed[name].append)

    threads = [threading.Thread(target=client, args=(n, 0.3 * i)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = {name: job.result(timeout=300) for name, job in jobs.items()}
    engine.shutdown()
    for name in names:
        segments, info = results[name]
        alone, alone_info = model.transcribe(_clip(data_dir, name), **GREEDY)
        assert _texts(segments) == _texts(alone), name
        assert _texts(streamed[name]) == _texts(segments), name  # streamed as windows finished
        assert info.duration == alone_info.duration
    assert engine.stats() == dict(queued=0, running=0, waiting_windows=0, busy_windows=0)


def test_cancel_frees_the_rows_and_spares_the_others(model, data_dir):
    engine = model.engine(batch_size=1, max_search=1)
    engine.start()
    long_job = None
    first_segment = threading.Event()

    def on_segment(segment):
        first_segment.set()

    long_job = engine.submit(_clip(data_dir, "c18_long_lecture.flac"), TranscribeOptions(**GREEDY), on_segment)
    assert first_segment.wait(300)
    short = engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(**GREEDY))
    long_job.cancel()
    # one row: the short clip can only run once the long one's row is free
    segments, _ = short.result(timeout=300)
    with pytest.raises(Cancelled):
        long_job.result(timeout=60)
    alone, _ = model.transcribe(_clip(data_dir, "c01_hello_short.flac"), **GREEDY)
    assert _texts(segments) == _texts(alone)
    engine.shutdown()
    assert engine.stats()["busy_windows"] == 0


def test_shutdown_drains_and_then_refuses(model, data_dir):
    engine = model.engine(batch_size=2, max_search=1)
    engine.start()
    jobs = [engine.submit(_clip(data_dir, n), TranscribeOptions(**GREEDY)) for n in ("c01_hello_short.flac", "c02_numbers.flac")]
    engine.shutdown(drain=True, timeout=300)
    assert all(job.done for job in jobs)
    assert all(len(job.result()[0]) >= 1 for job in jobs)
    with pytest.raises(EngineStopped):
        engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(**GREEDY))


def test_a_bad_audio_fails_alone(model, data_dir, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    engine = model.engine(batch_size=2, max_search=1)
    engine.start()
    broken = engine.submit(str(bad), TranscribeOptions(**GREEDY))
    good = engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(**GREEDY))
    with pytest.raises(Exception) as caught:
        broken.result(timeout=300)
    assert type(caught.value).__name__ == "AudioError"
    assert len(good.result(timeout=300)[0]) >= 1
    engine.shutdown()


def test_options_beyond_the_engine_state_are_refused(model, data_dir):
    engine = model.engine(batch_size=1, max_search=2)
    with pytest.raises(InvalidOptionError, match="at most 2"):
        engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(beam_size=5))


@pytest.mark.parametrize("options, per", [(GREEDY, 1), (dict(beam_size=5, temperature=0.0), 5)], ids=["greedy", "beams"])
def test_without_graphs_only_the_busy_rows_step(model, data_dir, monkeypatch, options, per):
    # An engine of 8 windows with one audio in flight: eagerly, each step runs that window's rows
    # alone, not all 8 windows' (a server's lone request stepped 8-16x the rows it needed)
    from ostinato.models.whisper.decoding import WindowDecoder

    stepped = []
    run_decoder = WindowDecoder.run_decoder

    def spy(self, rows, *args, **kwargs):
        stepped.append(rows)
        return run_decoder(self, rows, *args, **kwargs)

    clip = _clip(data_dir, "c02_numbers.flac")
    alone = _texts(model.transcribe(clip, **options)[0])
    monkeypatch.setattr(WindowDecoder, "run_decoder", spy)
    engine = model.engine(batch_size=8, max_search=5)
    engine.start()
    try:
        segments, _ = engine.submit(clip, model.options(**options)).result(timeout=120)
    finally:
        engine.shutdown()
    assert _texts(segments) == alone
    assert stepped and set(stepped) == {per}


def test_audio_workers_leave_the_cpu_threads_to_the_engine(model, data_dir):
    """An audio's worker does its host work on one CPU thread: its own OpenMP team would make the
    engine thread's parallel operators wait for sleeping threads (1.5 s against 1.2 s for one
    beam-5 clip on two cores). The engine thread keeps its count."""
    from ostinato.runtime import device as device_module

    if device_module.openmp_runtime() is None:
        pytest.skip("no OpenMP runtime in this process")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        alone = list(model.transcribe(_clip(data_dir, "c01_hello_short.flac"), **GREEDY)[0])
        engine = model.engine(batch_size=1, max_search=1)
        job = engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(**GREEDY),
                            on_segment=lambda s: seen.append((threading.current_thread().name, torch.get_num_threads())))
        engine.run()
        assert _texts(job.result()[0]) == _texts(alone)
        assert seen and all(name.startswith("ostinato-audio") and n == 1 for name, n in seen)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_collect_reports_only_the_windows_the_last_advance_stepped(model):
    """A window cancelled after its last step but before the look at the rows, and a new window put
    into its slot meanwhile (as a server's engine admits while the device steps): the look reports
    nothing for that slot; the new window comes back later with the tokens it gets alone."""
    from ostinato.models.whisper.search import SearchOptions, WindowJob, WindowRequest

    tok, dims = model.tokenizer, model.dims
    features = torch.randn(1, dims.n_audio_ctx, dims.n_audio_state, generator=torch.Generator().manual_seed(3))
    prompt = [tok.sot, tok.no_timestamps]
    short = WindowRequest(prompt, False, 50, 1, rng_seed=0)  # done after one step
    longer = WindowRequest(prompt, False, 50, 6, rng_seed=0)
    (alone,) = model.decode(features, [longer], [], [])
    run = model.batch_decoder(2, 2).start(SearchOptions(), [], [], 2)
    (slot,) = run.admit([WindowJob(features, short)])
    run.advance()
    run.evict(slot)
    assert run.admit([WindowJob(features, longer)]) == [slot]
    assert run.collect() == {}
    for _ in range(10):
        run.advance()
        got = run.collect()
        if got:
            break
    assert list(got) == [slot] and got[slot].tokens == alone.tokens and len(alone.tokens) > 1


def test_an_audio_starts_when_submitted_not_at_the_engines_next_round(model, data_dir):
    """Its worker reads the audio and asks for features at once, though no engine thread runs yet."""
    engine = model.engine(batch_size=2, max_search=1)
    job = engine.submit(_clip(data_dir, "c01_hello_short.flac"), TranscribeOptions(**GREEDY))
    deadline = time.time() + 30
    while engine._waiting == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert engine._waiting == 1 and engine.stats()["running"] == 1
    engine.start()
    segments, _ = job.result(timeout=120)
    engine.shutdown()
    assert segments


def test_features_on_their_way_are_handed_over_by_the_engine_thread(model, data_dir, monkeypatch):
    """On CUDA an audio's features come back by a copy the engine thread watches; the worker waits
    for the engine to say it landed (no CUDA call of its own). Here a copy that lands only at the
    engine's fifth look: the engine keeps looking while it has nothing else to do, and the result
    is the one without the delay."""
    from ostinato.models.whisper import engine as engine_module

    looks = []

    class SlowCopy(engine_module._OnTheWay):
        def __init__(self, device_tensor):
            super().__init__(device_tensor)
            self._landed.clear()
            self._looks = 0

        def arrived(self):
            self._looks += 1
            looks.append(self._looks)
            if self._looks >= 5:
                self._landed.set()
            return self._landed.is_set()

    clip = _clip(data_dir, "c01_hello_short.flac")
    want = _texts(model.transcribe_batch([clip], batch_size=2, **GREEDY)[0][0])
    monkeypatch.setattr(engine_module, "_OnTheWay", SlowCopy)
    engine = model.engine(batch_size=2, max_search=1)
    engine.start()
    job = engine.submit(clip, TranscribeOptions(**GREEDY))
    segments, _ = job.result(timeout=120)
    engine.shutdown()
    assert _texts(segments) == want and max(looks) >= 5


def test_a_window_joins_the_stepping_rows_only_once_its_encoder_pass_is_through(model, data_dir):
    """On CUDA the encoder runs on a stream of its own: a window loaded while its pass still runs
    would make the rows' stream wait for it. Here every encoder pass "lands" at the third look (a
    stand-in for its CUDA event): no window goes to the rows before that while others step, the
    rows' stream waits on that audio's own event, and every result is the one of transcribe."""
    names = ("c17_cut_two_windows.flac", "c01_hello_short.flac", "c02_numbers.flac")
    engine = model.engine(batch_size=2, max_search=1)

    class SlowPass:
        def __init__(self):
            self.looks = 0

        def query(self):
            self.looks += 1
            return self.looks >= 3

    class MainStream:
        waited = []

        def wait_event(self, event):
            self.waited.append(event)

    submitted = []  # (the window's pass landed, rows were stepping, the rows' stream waited on it)
    submit_windows = engine._submit_windows

    def watched(request):
        event = request.worker.encoded
        busy = engine._advancing or engine._scheduler.admitted > 0
        submitted.append((event.looks >= 3, busy, MainStream.waited[-1:] == [event]))
        submit_windows(request)

    engine._encoder_mark = SlowPass
    engine._main = MainStream()
    engine._submit_windows = watched
    engine.start()
    jobs = [engine.submit(_clip(data_dir, names[0]), TranscribeOptions(**GREEDY))]
    deadline = time.time() + 60
    while engine.stats()["busy_windows"] == 0 and time.time() < deadline:  # its first window steps
        time.sleep(0.005)
    jobs += [engine.submit(_clip(data_dir, name), TranscribeOptions(**GREEDY)) for name in names[1:]]
    results = [job.result(timeout=300) for job in jobs]
    engine.shutdown()
    for name, (segments, _) in zip(names, results):
        assert _texts(segments) == _texts(model.transcribe(_clip(data_dir, name), **GREEDY)[0]), name
    assert len(submitted) >= 4  # one window per clip, two for the cut recording
    assert all(waited for _, _, waited in submitted)
    assert all(landed or not busy for landed, busy, _ in submitted)
    assert any(busy for _, busy, _ in submitted)  # some did join rows that were stepping


def test_an_advance_replays_the_smallest_captured_graph_that_holds_the_busy_windows(model, data_dir, monkeypatch):
    """With graphs, a run's own graph (its rows) is captured when it opens, and a smaller bucket's
    the second time windows that fit it come to a run with no row in use (a capture resets the
    rows; the first time, the run's graph steps them, and a one-row bucket's capture is deferred to
    the engine's spare time, which the CPU's advances, done when launched, never leave); an advance
    replays the smallest captured bucket that holds every busy window, so one audio alone on an
    engine of four rows steps one row from the second lone audio on. On the CPU a stand-in records
    what would be captured and replayed and runs the eager step for the key it is given."""
    engine = model.engine(batch_size=4, max_search=1)
    real = engine._decoder.graph

    class Recorder:
        use_graphs = True

        def __init__(self):
            self.captured, self.replayed, self.deferred = [], [], []

        def is_captured(self, key):
            return key in self.captured

        def defer(self, key, **inputs):
            self.deferred.append(key)

        def capture(self, key, **inputs):
            self.captured.append(key)

        def __call__(self, key, **inputs):
            self.replayed.append(key)
            return real(key, **inputs)

        def __getattr__(self, name):
            return getattr(real, name)

    recorder = Recorder()
    monkeypatch.setattr(engine._decoder, "graph", recorder)
    engine.start()
    alone = _clip(data_dir, "c01_hello_short.flac")
    first, _ = engine.submit(alone, TranscribeOptions(**GREEDY)).result(timeout=120)
    assert [k.rows for k in recorder.captured] == [4]  # the run's own; one row is met for the first time
    assert [k.rows for k in recorder.deferred] == [1]  # and its capture deferred to spare time
    assert {k.rows for k in recorder.replayed} == {4}
    first_replays = len(recorder.replayed)
    segments, _ = engine.submit(alone, TranscribeOptions(**GREEDY)).result(timeout=120)
    assert [k.rows for k in recorder.captured] == [4, 1]  # met again: one row for the lone audio
    assert {k.rows for k in recorder.replayed[first_replays:]} == {1}
    assert _texts(first) == _texts(segments)
    lone_replays = len(recorder.replayed)
    names = ("c02_numbers.flac", "c01_hello_short.flac", "c17_cut_two_windows.flac")
    jobs = [engine.submit(_clip(data_dir, n), TranscribeOptions(**GREEDY)) for n in names]
    results = [job.result(timeout=300) for job in jobs]
    engine.shutdown()
    assert _texts(segments) == _texts(model.transcribe(alone, **GREEDY)[0])
    for name, (got, _) in zip(names, results):
        assert _texts(got) == _texts(model.transcribe(_clip(data_dir, name), **GREEDY)[0]), name
    later = recorder.replayed[lone_replays:]
    assert all(k in recorder.captured for k in recorder.replayed)
    assert 4 in {k.rows for k in later}  # several windows at once: the run's bucket


@pytest.mark.parametrize("critical_path_first", [True, False])
def test_the_longest_audio_goes_first_on_a_batch_engine(model, data_dir, critical_path_first):
    """transcribe_batch's engine serves first the audio with the most audio ahead of it (a long
    recording's windows follow one another: the batch ends when they do); a server's keeps arrival
    order. One row: the order of the rows' admissions is the order of service."""
    from ostinato.models.whisper.engine import TranscriptionEngine

    names = ("c01_hello_short.flac", "c02_numbers.flac", "c17_cut_two_windows.flac")  # 1.1, 11.6, 29 s
    engine = TranscriptionEngine(model, 1, 1, critical_path_first=critical_path_first)
    scheduler, admitted = engine._scheduler, []
    admit = scheduler._admit

    def recording_admit(*args, **kwargs):
        waiting = list(scheduler._waiting)
        count = admit(*args, **kwargs)
        owner = {id(t): w.job.index for w in engine._workers.values() for t in w.tickets}
        admitted.extend(owner[id(t)] for t in waiting[:count])
        return count

    scheduler._admit = recording_admit
    arrived, enqueue = [], engine._enqueue  # the order the decode requests reach the engine

    def recording_enqueue(request):
        with engine._lock:  # re-entrant: _enqueue takes it again, so the two orders cannot differ
            if request.kind == "decode":
                arrived.append(request.worker.job.index)
            enqueue(request)

    engine._enqueue = recording_enqueue
    jobs = [engine.submit(_clip(data_dir, name), TranscribeOptions(**GREEDY)) for name in names]
    engine.run()
    assert len(admitted) == 4  # the long clip has two windows
    if critical_path_first:
        # c17 first (29 s ahead), c01 (1.1 s) last; c17's second window (about 4 s left) and c02
        # (11.6 s) between, in the order they reach the queue
        assert admitted[0] == 2 and admitted[-1] == 0
    else:
        # arrival order: the audios' workers race, so their first requests may come in any order
        assert admitted == arrived and sorted(admitted) == [0, 1, 2, 2]
    segments, _ = jobs[2].result()
    alone, _ = model.transcribe(_clip(data_dir, names[2]), **GREEDY)
    assert _texts(segments) == _texts(alone)


class _AnsweringModel:
    """Stands in for the model behind an engine's answers to "vad" requests: records the audios it is
    asked for, and runs ``on_call`` (the test's) at each call."""

    def __init__(self, on_call=lambda name: None):
        self.asked, self.on_call = [], on_call

    def speech_probabilities(self, name):
        self.asked.append(name)
        self.on_call(name)
        return name


def _request(engine, name, remaining):
    from types import SimpleNamespace

    from ostinato.models.whisper.engine import _Request

    worker = SimpleNamespace(remaining=remaining, job=SimpleNamespace(cancelled=False), encoded=None)
    return _Request(worker, "vad", (name,))


@pytest.mark.parametrize("critical_path_first", [True, False])
def test_an_urgent_request_goes_before_the_rest_of_the_batch_in_hand(model, critical_path_first):
    """transcribe_batch's engine answers the most urgent request next, counting those that came while
    it answered the batch it took: a long recording's encoder pass does not wait for twenty audios'
    features. A round still answers only as many requests as its batch had (the rows are driven
    between rounds). A server's engine answers its batch in arrival order, the newcomer next round."""
    from ostinato.models.whisper.engine import TranscriptionEngine

    engine = TranscriptionEngine(model, 1, 1, critical_path_first=critical_path_first)
    urgent = _request(engine, "urgent", 100.0)

    def on_call(name):
        if name == "a":  # comes while "a" is answered
            engine._enqueue(urgent)

    engine.model = stand_in = _AnsweringModel(on_call)
    batch = [_request(engine, name, left) for name, left in (("a", 50.0), ("b", 1.0), ("c", 3.0))]
    engine._waiting = len(batch)
    engine._answer_all(list(batch))
    if critical_path_first:
        # as many answers as the batch had, then the rows' turn: the least urgent waits for the next
        assert stand_in.asked == ["a", "urgent", "c"] and engine._queue == [batch[1]]
        assert urgent.ready.is_set() and urgent.result == "urgent"
    else:
        assert stand_in.asked == ["a", "b", "c"] and engine._queue == [urgent]
    rest, engine._queue = engine._queue, []  # the next round, as _next_requests hands it over
    engine._answer_all(rest)
    assert all(r.ready.is_set() and r.result == r.args[0] for r in batch + [urgent])


def test_a_failing_answer_leaves_no_request_of_its_batch_unanswered(model):
    """A model call that raises stops the engine; the requests it had in hand, the failing one and
    those not yet answered, are answered by the stop instead of leaving their workers waiting."""
    from ostinato.models.whisper.engine import TranscriptionEngine

    def on_call(name):
        if name == "b":
            raise RuntimeError("the device fell over")

    engine = TranscriptionEngine(model, 1, 1, critical_path_first=True)
    engine.model = _AnsweringModel(on_call)
    batch = [_request(engine, name, left) for name, left in (("a", 3.0), ("b", 2.0), ("c", 1.0))]
    engine._waiting = len(batch)
    with pytest.raises(RuntimeError, match="fell over") as failure:
        engine._answer_all(list(batch))
    assert batch[0].result == "a" and not batch[1].ready.is_set() and not batch[2].ready.is_set()
    engine._stop(failure.value)
    assert all(r.ready.is_set() for r in batch)
    assert [type(r.error) for r in batch[1:]] == [Cancelled, Cancelled]


def test_the_engine_gives_the_run_its_spare_time_while_an_advance_runs(model):
    """While an advance is on the device, no window can be loaded, no request waits and none can come
    (every live worker waits on an answer), the engine thread lets the run do the work it put off (a
    deferred graph capture); with a window to load it loads it instead. Driven here with a stand-in run whose advance ends when the test says."""
    from ostinato.runtime import RowScheduler, SlotTable

    log = []

    class Run(SlotTable):
        admits_while_advancing = True

        def __init__(self):
            super().__init__(2)
            self.ready = True

        def admit(self, items):
            slots = self.take(len(items))
            for slot in slots:
                self.occupy(slot, None)
            log.append(("admit", len(items)))
            return slots

        def advance(self, refill):
            self.ready = False

        def stop_soon(self):
            pass

        def collect(self):
            return {}

        def use_spare_time(self):
            log.append(("spare",))
            return True

    engine = model.engine(batch_size=2, max_search=1)
    engine._scheduler = scheduler = RowScheduler(lambda key: Run())
    scheduler.submit("k", "window a", lambda r, e: None)
    engine._drive_rows()  # admitted and launched
    assert engine._advancing and log == [("admit", 1)]
    engine._drive_rows()  # the advance is on the device, nothing to do: spare time
    assert log[-1] == ("spare",)
    scheduler.submit("k", "window b", lambda r, e: None)
    engine._drive_rows()  # a window to load: loaded behind the advance, no spare time
    assert log[-1] == ("admit", 1) and log.count(("spare",)) == 1
    engine._queue.append("a request")  # a worker's request waits: answered first
    engine._drive_rows()
    assert log.count(("spare",)) == 1
    engine._queue.clear()
    # A live worker in its own work (not waiting on an answer) may ask at any moment: no spare time,
    # which would make its request wait for the capture; once it waits too, the time is spare.
    engine._workers = {"job": "a worker"}
    engine._waiting = 0
    engine._drive_rows()
    assert log.count(("spare",)) == 1
    engine._waiting = 1
    engine._drive_rows()
    assert log.count(("spare",)) == 2
    engine._workers, engine._waiting = {}, 0
