"""``ostinato serve`` as clients use it: a real server on the loopback, driven by the official ``openai``
client and plain HTTP; what it answers is ``WhisperModel.transcribe``'s result for the same options.
Every request loop here is bounded and aimed at 127.0.0.1 only."""
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from ostinato import WhisperModel  # noqa: E402
from ostinato.models.transducer import TransducerModel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NEMO = ROOT / "tests" / "data" / "transducer" / "tiny_tdt.nemo"
GREEDY = {"beam_size": 1, "best_of": 1}  # with temperature=0: greedy, no fallback
SHORT, NUMBERS, NOISY, LONG = "c01_hello_short.flac", "c02_numbers.flac", "c05_white20_m3.flac", "c18_long_lecture.flac"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ostinato", "serve", "--port", str(self.port), "--device", "cpu", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited: " + self.proc.stdout.read())
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("the server did not become ready in 120 s")

    def client(self, api_key="none", **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def server(tiny_en_path):
    """Both families behind one endpoint: Whisper tiny.en (also whisper-1) and a tiny transducer."""
    s = Server("--batch-size", "8", "--model", f"tiny.en={tiny_en_path}", "--model", str(NEMO))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model(tiny_en_path):
    return WhisperModel(str(tiny_en_path), device="cpu", compute_type="float32")


@pytest.fixture(scope="module")
def clip(data_dir):
    return lambda name: data_dir / "clips" / name


def _alone(model, path, **options):
    segments, info = model.transcribe(str(path), temperature=0.0, **GREEDY, **options)
    return list(segments), info


def _create(client, path, **kw):
    with open(path, "rb") as f:
        return client.audio.transcriptions.create(model="whisper-1", file=f, temperature=0.0,
                                                  extra_body=dict(GREEDY, **kw.pop("extra_body", {})), **kw)


def test_every_response_format(server, model, clip):
    client = server.client()
    segments, info = _alone(model, clip(NUMBERS))
    text = "".join(s.text for s in segments).strip()
    verbose = _create(client, clip(NUMBERS), response_format="verbose_json")
    assert [s.tokens for s in verbose.segments] == [s.tokens for s in segments]
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(s.start, s.end, s.text) for s in segments]
    assert verbose.text == text and verbose.language == "en" and verbose.duration == pytest.approx(info.duration)
    assert _create(client, clip(NUMBERS)).text == text
    assert _create(client, clip(NUMBERS), response_format="text").strip() == text
    srt = _create(client, clip(NUMBERS), response_format="srt")
    vtt = _create(client, clip(NUMBERS), response_format="vtt")
    assert srt.startswith("1\n00:00:") and "-->" in srt and segments[0].text.strip() in srt
    assert vtt.startswith("WEBVTT") and segments[0].text.strip() in vtt
    assert [m.id for m in client.models.list().data] == ["tiny.en", "tiny_tdt"]


def test_word_timestamps(server, model, clip):
    segments, _ = _alone(model, clip(SHORT), word_timestamps=True)
    got = _create(server.client(), clip(SHORT), response_format="verbose_json", timestamp_granularities=["word"])
    assert [(w.word, w.start, w.end) for w in got.words] == [(w.word, w.start, w.end) for s in segments for w in s.words]


@pytest.mark.skipif(not __import__("ostinato.audio.vad", fromlist=["x"]).onnx_available(),
                    reason="the VAD extra is not installed")
def test_vad_filter_and_batched_as_extra_fields(server, model, clip):
    """The VAD options reach the server as extra form fields, and come back as transcribe's result."""
    client = server.client()
    params = {"min_silence_duration_ms": 500, "speech_pad_ms": 200}
    for options in ({"vad_filter": True, "vad_parameters": params}, {"batched": True}):
        segments, info = _alone(model, clip(LONG), **options)
        body = dict(options, vad_parameters=json.dumps(options["vad_parameters"])) if "vad_parameters" in options \
            else options
        got = _create(client, clip(LONG), response_format="verbose_json", extra_body=body)
        assert [s.tokens for s in got.segments] == [s.tokens for s in segments], options
        assert [(s.start, s.end) for s in got.segments] == [(s.start, s.end) for s in segments]
    with open(clip(SHORT), "rb") as f:
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="whisper-1", file=f,
                                               extra_body={"vad_filter": True, "vad_parameters": '{"pad": 1}'})
    assert "unknown vad_parameters: pad" in caught.value.message


def test_streaming_sends_the_text_as_windows_finish(server, model, clip):
    segments, _ = _alone(model, clip("c17_cut_two_windows.flac"))  # two windows: two deltas
    with open(clip("c17_cut_two_windows.flac"), "rb") as f:
        events = list(server.client().audio.transcriptions.create(
            model="whisper-1", file=f, temperature=0.0, stream=True, extra_body=GREEDY))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas == [s.text for s in segments]
    assert events[-1].type == "transcript.text.done" and events[-1].text == "".join(deltas).strip()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # OpenAI calls its translations endpoint deprecated
def test_translation_endpoint(server, model, clip):
    with open(clip(SHORT), "rb") as f:
        got = server.client().audio.translations.create(model="whisper-1", file=f, temperature=0.0, extra_body=GREEDY)
    segments, _ = _alone(model, clip(SHORT), task="translate")
    assert got.text == "".join(s.text for s in segments).strip()


def test_a_transducer_on_the_same_endpoint(server, clip):
    """A .nemo model is served beside Whisper: its answer is transcribe_segments' for the audio alone
    (every format, streaming, max_symbols), and Whisper's own fields get a 400."""
    model = TransducerModel(NEMO, device="cpu")
    client = server.client()
    for name, options in ((NUMBERS, {}), (SHORT, {"max_symbols": 3})):
        segments, info = model.transcribe_segments(str(clip(name)), **options)
        segments = list(segments)
        with open(clip(name), "rb") as f:
            got = client.audio.transcriptions.create(model="tiny_tdt", file=f, response_format="verbose_json",
                                                     extra_body=options)
        assert [s.tokens for s in got.segments] == [s.tokens for s in segments]
        assert got.text == "".join(s.text for s in segments).strip() and got.language == "und"
        assert got.duration == pytest.approx(info.duration)
    segments = list(model.transcribe_segments(str(clip(NUMBERS)))[0])
    with open(clip(NUMBERS), "rb") as f:
        events = list(client.audio.transcriptions.create(model="tiny_tdt", file=f, stream=True))
    assert [e.delta for e in events[:-1]] == [s.text for s in segments] and events[-1].type == "transcript.text.done"
    with open(clip(NUMBERS), "rb") as f:
        assert client.audio.transcriptions.create(model="tiny_tdt", file=f, response_format="srt").startswith("1\n")
    data = clip(SHORT).read_bytes()
    for fields, fragment in (({"beam_size": "2"}, "beam_size"), ({"language": "en"}, "language"),
                             ({"prompt": "hi"}, "prompt"), ({"temperature": "0"}, "temperature"),
                             ({"timestamp_granularities[]": "word"}, "Whisper"), ({"max_symbols": "0"}, "max_symbols")):
        r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", data)},
                       data=dict(fields, model="tiny_tdt"), timeout=60)
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], (fields, r.text)
    r = httpx.post(server.url + "/v1/audio/translations", files={"file": ("a.flac", data)}, data={"model": "tiny_tdt"},
                   timeout=60)
    assert r.status_code == 400 and "translation" in r.json()["error"]["message"]


@pytest.mark.parametrize("content, status, fragment", [
    (b"", 400, "empty"),
    (b"RIFF\x00\x00\x00\x00WAVEjunk", 400, "not audio"),
    (b"plain text, no audio in here at all", 400, "not audio"),
])
def test_bad_uploads_get_json_errors_and_the_server_goes_on(server, clip, content, status, fragment):
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("x.wav", content)}, timeout=60)
    assert r.status_code == status
    error = r.json()["error"]
    assert fragment in error["message"] and "Traceback" not in r.text and error["type"] == "invalid_request_error"
    assert _create(server.client(), clip(SHORT)).text


@pytest.mark.parametrize("fields, status, fragment", [
    ({"model": "nope"}, 404, "not served"),
    ({"beam_size": "0"}, 400, "beam_size"),
    ({"beam_size": "two"}, 400, "beam_size"),
    ({"beam_size": "9"}, 400, "at most 5"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"stream": "maybe"}, 400, "stream"),
    ({"response_format": "xml"}, 400, "response_format"),
    ({"bogus": "1"}, 400, "bogus"),
    ({"timestamp_granularities[]": "sentence"}, 400, "timestamp_granularities"),
])
def test_bad_fields(server, clip, fields, status, fragment):
    with open(clip(SHORT), "rb") as f:
        r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", f.read())}, data=fields,
                       timeout=60)
    assert r.status_code == status and fragment in r.json()["error"]["message"], r.text


def test_health_ready_and_metrics(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/ready").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("ostinato_requests_total", "ostinato_queue_depth", "ostinato_busy_windows",
                 "ostinato_audio_seconds_total", "ostinato_request_latency_seconds_bucket"):
        assert name in metrics
    assert "<title>ostinato</title>" in httpx.get(server.url + "/").text


def test_load_many_clients_mixed_lengths_some_corrupt(server, model, clip):
    """64 requests, 16 in flight, mixed lengths and corrupt uploads, some streamed: every good request
    gets exactly its transcribe result, every bad one its error."""
    names = [SHORT, NUMBERS, NOISY, "c17_cut_two_windows.flac", "c03_questions_f3.flac", "c12_tail_word.flac"]
    want = {n: _alone(model, clip(n))[0] for n in names}
    blobs = {n: clip(n).read_bytes() for n in names}
    plan = [(i, names[i % len(names)] if i % 8 else "corrupt") for i in range(64)]
    fields = dict(temperature="0", **{k: str(v) for k, v in GREEDY.items()})

    def one(job):
        i, name = job
        content = b"\x00garbage" * 100 if name == "corrupt" else blobs[name]
        if i % 5 == 1:  # streamed: the deltas, then the whole text
            with httpx.stream("POST", server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", content)},
                              data=dict(fields, stream="true"), timeout=300) as r:
                if r.status_code != 200:
                    r.read()
                    return name, r.status_code, r.json()
                events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line]
            return name, "stream", events
        r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", content)},
                       data=dict(fields, response_format="verbose_json"), timeout=300)
        return name, r.status_code, r.json()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, plan))
    assert len(results) == 64 and sum(status == "stream" for _, status, _ in results) >= 10
    for name, status, body in results:
        if name == "corrupt":
            assert status == 400 and "not audio" in body["error"]["message"]
        elif status == "stream":
            assert [e["delta"] for e in body[:-1]] == [s.text for s in want[name]], name
            assert body[-1] == {"type": "transcript.text.done", "text": "".join(s.text for s in want[name]).strip()}
        else:
            assert status == 200 and [s["tokens"] for s in body["segments"]] == [s.tokens for s in want[name]], name


def test_a_client_that_goes_away_frees_its_rows(server, clip):
    data = clip(LONG).read_bytes()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", data)},
                   data={"beam_size": "1", "best_of": "1", "temperature": "0"}, timeout=1.0)
    deadline = time.time() + 30
    while _running(server) and time.time() < deadline:  # the cancelled request's windows leave the rows
        time.sleep(0.2)
    assert _running(server) == 0.0, "the abandoned request kept running"
    assert _create(server.client(), clip(SHORT)).text


def _running(server) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("ostinato_running_audios{"))


def test_a_stream_that_goes_away_frees_its_rows(server, clip):
    data = clip(LONG).read_bytes()
    fields = {"beam_size": "1", "best_of": "1", "temperature": "0", "stream": "true"}
    with httpx.stream("POST", server.url + "/v1/audio/transcriptions", files={"file": ("a.flac", data)},
                      data=fields, timeout=60) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line)  # the first window's text has arrived
        assert json.loads(first[len("data: "):])["type"] == "transcript.text.delta"
    deadline = time.time() + 30  # the connection is closed: its windows leave the rows
    while _running(server) and time.time() < deadline:
        time.sleep(0.2)
    assert _running(server) == 0.0, "the abandoned stream kept running"


def test_api_key_upload_limit_and_full_queue(clip):
    s = Server("--api-key", "sesame", "--max-upload-mb", "0.8", "--max-queue", "1", "--batch-size", "1")
    try:
        with pytest.raises(openai.AuthenticationError):
            _create(s.client(api_key="wrong"), clip(SHORT))
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert _create(s.client(api_key="sesame"), clip(SHORT)).text
        big = clip(LONG).read_bytes()
        r = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.flac", big)},
                       headers={"Authorization": "Bearer sesame"}, timeout=60)
        assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
        boundary = "b0undary"

        def chunked():  # no content-length: cut off as it arrives
            yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.flac\"\r\n\r\n").encode()
            for start in range(0, len(big), 65536):
                yield big[start:start + 65536]
            yield f"\r\n--{boundary}--\r\n".encode()

        r = httpx.post(s.url + "/v1/audio/transcriptions", content=chunked(), timeout=60,
                       headers={"Authorization": "Bearer sesame",
                                "Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
        small = clip("c17_cut_two_windows.flac").read_bytes()

        def one(_):
            return httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.flac", small)},
                              data={"beam_size": "1", "best_of": "1", "temperature": "0"},
                              headers={"Authorization": "Bearer sesame"}, timeout=300)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(one, range(6)))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes, codes
        assert all(r.headers.get("retry-after") == "1" for r in responses if r.status_code == 429)
    finally:
        s.stop()


def test_sigterm_finishes_what_is_in_flight_and_exits_0(clip):
    s = Server("--batch-size", "4")
    data = clip("c17_cut_two_windows.flac").read_bytes()
    fields = {"beam_size": "1", "best_of": "1", "temperature": "0"}

    def one(i):
        if i == 3:  # a stream in flight is drained too
            with httpx.stream("POST", s.url + "/v1/audio/transcriptions", files={"file": ("a.flac", data)},
                              data=dict(fields, stream="true"), timeout=300) as r:
                return r.status_code, [json.loads(line[6:]) for line in r.iter_lines() if line][-1]["text"]
        r = httpx.post(s.url + "/v1/audio/transcriptions", files={"file": ("a.flac", data)}, data=fields, timeout=300)
        return r.status_code, r.json()["text"]

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(one, i) for i in range(4)]
            deadline = time.time() + 30  # until all four are being transcribed
            while _running(s) < 4 and time.time() < deadline:
                time.sleep(0.05)
            s.proc.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        assert [status for status, _ in responses] == [200] * 4
        assert len({text for _, text in responses}) == 1 and responses[0][1]
        assert s.proc.wait(60) == 0
        with pytest.raises(httpx.ConnectError):  # and it took no more
            httpx.get(s.url + "/health", timeout=5)
    finally:
        s.stop()
