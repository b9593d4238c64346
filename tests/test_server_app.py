"""The HTTP side of ``ostinato serve`` on a stand-in model (no weights): readiness before and after the
warm-up, OpenAI-shaped errors for routing and malformed bodies, the upload limit without a length
header, a finished queue place after every kind of answer, and the job a hung-up client leaves
cancelled. Fast and deterministic; tests/test_server.py drives the real server and model."""
import asyncio
import threading
from concurrent.futures import Future

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from ostinato.errors import InvalidOptionError  # noqa: E402
from ostinato.results import Segment, TranscriptionInfo  # noqa: E402
from ostinato.serve.app import create_app  # noqa: E402


def _wav(seconds=0.5) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x10" * int(16000 * seconds))
    return out.getvalue()


class FakeJob:
    def __init__(self, on_segment):
        self.on_segment = on_segment
        self.future = Future()
        self.cancelled = False

    @property
    def done(self):
        return self.future.done()

    def result(self, timeout=None):
        return self.future.result(timeout)

    def cancel(self):
        self.cancelled = True


class FakeService:
    """Answers each audio with two segments, at once or when the test says (``hold``)."""

    family = "whisper"
    sample_rate = 16000

    def __init__(self, hold=False):
        self.warm = False
        self.released = threading.Event()
        self.hold = hold
        self.jobs = []

    def options(self, **fields):
        if fields.get("beam_size", 1) < 1:
            raise InvalidOptionError("beam_size must be at least 1")
        return fields

    def submit(self, audio, options, on_segment=None):
        job = FakeJob(on_segment)
        self.jobs.append(job)
        if not self.hold:
            self.finish(job, len(audio) / 16000)
        return job

    def finish(self, job, duration=0.5):
        segments = [Segment(i, 0, i, i + 1.0, f" word{i}", [i], -0.1, 1.0, 0.0) for i in range(2)]
        for s in segments:
            if job.on_segment is not None:
                job.on_segment(s)
        job.future.set_result((segments, TranscriptionInfo("en", 1.0, duration)))

    def warm_up(self):
        self.released.wait(10)
        self.warm = True

    def stats(self):
        return dict(queued=0, running=sum(not j.done for j in self.jobs), waiting_windows=0, busy_windows=0)

    def shutdown(self):
        pass


@pytest.fixture
def app_and_service():
    from fastapi.testclient import TestClient

    service = FakeService()
    app = create_app({"fake": service}, max_upload_mb=0.1, max_queue=2)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, service


def test_ready_only_after_the_warm_up(app_and_service):
    client, service = app_and_service
    assert client.get("/health").status_code == 200
    assert client.get("/ready").status_code == 503
    service.released.set()
    for _ in range(100):
        if client.get("/ready").status_code == 200:
            break
        threading.Event().wait(0.05)
    assert client.get("/ready").json() == {"ready": True}


def test_openai_shaped_errors_everywhere(app_and_service):
    client, _ = app_and_service
    for response, status in ((client.get("/v1/nothing"), 404), (client.get("/v1/audio/transcriptions"), 405),
                             (client.post("/v1/audio/transcriptions", content=b"--x\r\nbroken",
                                          headers={"content-type": "multipart/form-data; boundary=x"}), 400),
                             (client.post("/v1/audio/transcriptions", json={"file": "nope"}), 400)):
        assert response.status_code == status, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert "Traceback" not in response.text


def test_an_upload_without_a_length_is_cut_off_at_the_limit(app_and_service):
    client, _ = app_and_service
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode()

    def body():  # chunked: no content-length to refuse it by
        yield head
        for _ in range(40):
            yield b"\x00" * 8192
        yield f"\r\n--{boundary}--\r\n".encode()

    r = client.post("/v1/audio/transcriptions", content=body(),
                    headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"

    def small():  # the same way under the limit: transcribed
        yield head + _wav() + f"\r\n--{boundary}--\r\n".encode()

    r = client.post("/v1/audio/transcriptions", content=small(),
                    headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 200 and r.json()["text"] == "word0 word1"


def test_an_upload_under_the_limit_is_parsed_in_memory(monkeypatch):
    """A 3-MB upload (past Starlette's 1-MB spool) never goes to a temporary file: the server reads
    it whole anyway, and a file's chunk-by-chunk writes cost the event loop 10x the parse."""
    import tempfile

    from fastapi.testclient import TestClient
    from starlette import formparsers

    rolled = []

    class Watched(tempfile.SpooledTemporaryFile):
        def rollover(self):
            rolled.append(self)
            super().rollover()

    monkeypatch.setattr(formparsers, "SpooledTemporaryFile", Watched)
    service = FakeService()
    with TestClient(create_app({"fake": service}, max_upload_mb=8), raise_server_exceptions=False) as client:
        big = _wav(seconds=100.0)
        assert len(big) > 3_000_000
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", big)}, data={"model": "fake"})
    assert r.status_code == 200, r.text
    assert not rolled


def test_every_answer_gives_its_queue_place_back(app_and_service):
    client, service = app_and_service
    wav = _wav()
    for data in ({}, {"stream": "true"}, {"beam_size": "0"}, {"response_format": "srt"}, {"stream": "true"}):
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data=data)
        assert r.status_code in (200, 400)
    # the queue holds 2: five answered requests later, two more still fit side by side
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"stream": "true"})
    assert r.status_code == 200 and r.text.count("transcript.text.delta") == 2
    assert '"type": "transcript.text.done", "text": "word0 word1"' in r.text
    body = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                       data={"response_format": "verbose_json"}).json()
    assert body["usage"] == {"type": "duration", "seconds": 1} and [s["id"] for s in body["segments"]] == [0, 1]
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"stream": "true",
                                                                                     "response_format": "srt"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_a_client_that_hangs_up_cancels_its_job():
    """On a real loopback connection: the request waits on its job; the client goes away; the job is
    cancelled and the queue place comes back, with no polling in between."""
    import socket

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = FakeService(hold=True)
    service.released.set()
    server = uvicorn.Server(uvicorn.Config(create_app({"fake": service}, max_queue=1), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            threading.Event().wait(0.05)
        for data in ({}, {"stream": "true"}):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, data=data, timeout=1.0)
            for _ in range(100):
                if service.jobs[-1].cancelled:
                    break
                threading.Event().wait(0.05)
            assert service.jobs[-1].cancelled, data
            service.finish(service.jobs[-1])
        # the one queue place is free again
        service.hold = False
        r = httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, timeout=10)
        assert r.status_code == 200 and r.json()["text"] == "word0 word1"
    finally:
        server.should_exit = True
        thread.join(10)


def test_no_event_loop_left_waiting():
    """The waiting helpers leave no task behind once a job is done."""
    from ostinato.serve.app import _finished_or_gone

    class Receiver:
        async def receive(self):
            await asyncio.sleep(3600)

    async def main():
        job = FakeJob(None)
        threading.Timer(0.05, lambda: job.future.set_result(([], None))).start()
        assert await asyncio.wait_for(_finished_or_gone(Receiver(), job), 5)
        await asyncio.sleep(0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []


def test_served_names_and_command_line_mistakes(capsys):
    from ostinato.cli import EXIT_USAGE, main
    from ostinato.serve.command import parse_models

    assert parse_models(None) == [("tiny.en", None)]
    assert parse_models(["models/whisper-small/", "fast=/m/tdt.nemo", "/x/large.pt"]) == [
        ("whisper-small", "models/whisper-small/"), ("fast", "/m/tdt.nemo"), ("large", "/x/large.pt")]
    with pytest.raises(InvalidOptionError, match="share a name"):
        parse_models(["a/tiny", "b/tiny"])
    for argv, fragment in ((["--batch-size", "0"], "--batch-size"), (["--max-queue", "0"], "--max-queue"),
                           (["--beam-size", "0"], "--beam-size"), (["--max-upload-mb", "0"], "--max-upload-mb"),
                           (["--model", "=x"], "--model"), (["--device", "tpu"], "device")):
        assert main(["serve", *argv]) == EXIT_USAGE, argv
        assert fragment in capsys.readouterr().err, argv


def test_the_loading_thread_leaves_the_cpu_threads_to_the_engines(tiny_en_path):
    """``build_services`` runs on the thread that then serves HTTP: its torch work is serial, so no
    OpenMP team of its own slows the engine threads' operators (on two cores a 1-s clip at beam 5
    took 1.7-2.0 s through the server, 1.3-1.4 s after this and the workers' fix; 1.2 s direct)."""
    import torch

    from ostinato.runtime import device as device_module
    from ostinato.serve.command import build_services

    if device_module.openmp_runtime() is None:
        pytest.skip("no OpenMP runtime in this process")
    seen = {}

    def load():  # on a thread of its own: the test process's main thread keeps its count
        services = build_services([("tiny.en", str(tiny_en_path))], device="cpu", compute_type="float32",
                                  decode_loop="auto", batch_size=2, max_search=1, defaults={})
        seen["loader"] = torch.get_num_threads()
        seen["family"] = services["tiny.en"].family
        for service in services.values():
            service.shutdown()

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    assert seen == {"loader": 1, "family": "whisper"}
