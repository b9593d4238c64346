"""The HTTP side: OpenAI's audio endpoints, models, health, readiness, metrics and a page.

Handlers parse, validate and submit; the services' engine threads do all device work. Every
refusal is an OpenAI-style JSON error; uploads are read in memory and dropped with the request.
A handler waiting for its transcription sleeps on the job's future and on the connection at once
(no polling): whichever comes first wakes it, and a client that hangs up cancels its job.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import aclosing, asynccontextmanager
from importlib import resources
from typing import Any, Callable, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser

from ..audio import load_audio
from ..errors import AudioError, InvalidOptionError, OstinatoError
from ..models.whisper.engine import Cancelled, EngineStopped
from ..models.whisper.options import parse_temperature
from .errors import ApiError
from .formats import FORMATS, full_text, render
from .metrics import Metrics

log = logging.getLogger("ostinato.serve")
WHISPER_ALIAS = "whisper-1"

# Form fields beyond OpenAI's that reach the options, as vLLM takes extra parameters; name -> type.
EXTRA_FIELDS = {
    "beam_size": int, "best_of": int, "patience": float, "length_penalty": float, "repetition_penalty": float,
    "no_repeat_ngram_size": int, "condition_on_previous_text": bool, "prompt_reset_on_temperature": float,
    "compression_ratio_threshold": float, "log_prob_threshold": float, "no_speech_threshold": float,
    "suppress_blank": bool, "suppress_tokens": list, "max_initial_timestamp": float, "max_new_tokens": int,
    "word_timestamps": bool, "prepend_punctuations": str, "append_punctuations": str, "without_timestamps": bool,
    "hallucination_silence_threshold": float, "prefix": str, "hotwords": str, "clip_timestamps": str, "seed": int,
    "max_symbols": int, "vad_filter": bool, "vad_parameters": dict, "batched": bool,
}
# Options whose "off" is None: the form says so with "none" (or "null").
NULLABLE = {"compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold", "max_new_tokens",
            "hallucination_silence_threshold", "suppress_tokens", "seed"}
OPENAI_FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature",
                 "timestamp_granularities[]", "timestamp_granularities", "stream", "include[]", "include"}
_DONE = object()  # the end of a job's segments on a stream's queue


class _UploadTooLarge(Exception):
    pass


class _Admissions:
    """Requests per model past the queue check and not answered yet. Counted in the event loop's one
    thread from the check until the answer, so requests that arrive together cannot all slip past
    it while their audio decodes."""

    def __init__(self, names, limit: int):
        self.limit = limit
        self.count = {name: 0 for name in names}

    def admit(self, name: str) -> Callable[[], None]:
        """A place in the queue, or a 429; the returned release gives it back (once, however often called)."""
        if self.count[name] >= self.limit:
            raise ApiError(429, "too many requests in the queue: try again shortly", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        self.count[name] += 1
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                self.count[name] -= 1
        return release


def create_app(services: Dict[str, Any], *, api_key: Optional[str] = None, max_upload_mb: float = 25.0,
               max_queue: int = 64) -> FastAPI:
    """``services``: served id -> a service of ``services.py`` (already started)."""
    metrics = Metrics()
    max_bytes = int(max_upload_mb * 1024 * 1024)
    admissions = _Admissions(services, max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        warmer = threading.Thread(target=_warm_all, args=(services,), name="ostinato-warm-up", daemon=True)
        warmer.start()
        yield
        # uvicorn has stopped taking requests and let the ones in flight finish: drain and stop
        for service in services.values():
            await asyncio.to_thread(service.shutdown)

    app = FastAPI(title="ostinato", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):  # 404 and 405 of routing, bad multipart
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # a bug: say so, never show a traceback
        return JSONResponse(ApiError(500, f"internal error ({type(exc).__name__})", "server_error").body(),
                            status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        warm = all(s.warm for s in services.values())
        return JSONResponse({"ready": warm}, status_code=200 if warm else 503)

    @app.get("/metrics")
    async def prometheus():
        metrics.observe_services(services)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        _check_key(request, api_key)
        created = int(time.time())
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "ostinato"}
                                           for name in services]}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("ostinato.serve").joinpath("page.html").read_text(encoding="utf-8")

    async def handle(request: Request, task: str, endpoint: str):
        start = time.perf_counter()
        status = 500
        try:
            response = await _transcribe(request, task)
            status = response.status_code
            return response
        except ApiError as exc:
            status = exc.status
            raise
        finally:
            metrics.requests.labels(endpoint, str(status)).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

    async def _transcribe(request: Request, task: str) -> Response:
        _check_key(request, api_key)
        too_large = ApiError(413, f"the upload is larger than {max_upload_mb:g} MB", code="file_too_large")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes + 64 * 1024:
            raise too_large
        # The body is counted as it arrives, so an upload without a length is cut off at the limit too.
        request = Request(request.scope, _counted(request.receive, max_bytes + 64 * 1024))
        try:
            form = await _read_form(request, max_bytes + 64 * 1024)
        except _UploadTooLarge:
            raise too_large from None
        try:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise ApiError(400, "the form needs a 'file' field holding the audio", param="file")
            data = await upload.read(max_bytes + 1)
        finally:
            await form.close()  # a spooled upload goes with the request
        if len(data) > max_bytes:
            raise too_large
        if not data:
            raise ApiError(400, "the uploaded file is empty", param="file")
        name, service = _service(services, form.get("model"))
        fields = _option_fields(form, task, service.family)
        fmt = str(form.get("response_format") or "json")
        if fmt not in FORMATS:
            raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}", param="response_format")
        granularities = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
        bad = [g for g in granularities if g not in ("segment", "word")]
        if bad:
            raise ApiError(400, f"timestamp_granularities takes segment and word, not {bad[0]}",
                           param="timestamp_granularities[]")
        words = "word" in granularities or (fmt == "verbose_json" and fields.get("word_timestamps") is True)
        if "word" in granularities:
            if service.family != "whisper":
                raise ApiError(400, "word timestamps need a Whisper model", param="timestamp_granularities[]")
            fields["word_timestamps"] = True
        stream = _typed("stream", form.get("stream") or "false", bool)
        if stream and fmt not in ("json", "text"):
            raise ApiError(400, "stream=true sends text events: use response_format json or text", param="stream")
        try:
            options = service.options(**fields)
        except InvalidOptionError as exc:
            raise ApiError(400, str(exc)) from None
        release = admissions.admit(name)
        try:
            samples = await _decode(data, service.sample_rate)
            del data
            sink = _Segments() if stream else None
            job = _submit(service, samples, options, sink)
            if stream:
                response = _stream(request, job, sink, name, release)
                release = None  # the stream gives the place back when it ends
                return response
            return await _answer(request, job, name, fmt, task, words)
        finally:
            if release is not None:
                release()

    async def _answer(request: Request, job, name: str, fmt: str, task: str, words: bool) -> Response:
        if not await _finished_or_gone(request, job):
            job.cancel()  # the client hung up: its rows go back to the others at once
            return Response(status_code=499)
        segments, info = _outcome(job)
        metrics.audio.labels(name).inc(info.duration)
        body, media = render(segments, info, fmt, task, words)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media)

    def _stream(request: Request, job, sink: "_Segments", name: str, release: Callable[[], None]) -> StreamingResponse:
        def finish() -> None:
            if not job.done:
                job.cancel()  # the client went away: free its rows
            release()

        async def events():
            queue = sink.attach(asyncio.get_running_loop())
            job.future.add_done_callback(lambda _: sink.put(_DONE))
            gone = asyncio.ensure_future(_hung_up(request))
            item = None
            sent = 0
            try:
                while True:
                    item = asyncio.ensure_future(queue.get())
                    await asyncio.wait((item, gone), return_when=asyncio.FIRST_COMPLETED)
                    if not item.done():  # the client hung up
                        return
                    segment = item.result()
                    if segment is _DONE:
                        break
                    sent += 1
                    yield _event({"type": "transcript.text.delta", "delta": segment.text})
                try:
                    segments, info = _outcome(job)
                except ApiError as exc:
                    yield _event({"type": "error", "error": exc.body()["error"]})
                    return
                for segment in segments[sent:]:  # any not delivered on the queue (none, in practice)
                    yield _event({"type": "transcript.text.delta", "delta": segment.text})
                metrics.audio.labels(name).inc(info.duration)
                yield _event({"type": "transcript.text.done", "text": full_text(segments)})
            finally:
                gone.cancel()
                if item is not None:
                    item.cancel()
                finish()

        # A client that hangs up before the first event never starts the generator: the background
        # task (run once the response is over, however it ended) gives the place back then.
        return StreamingResponse(events(), media_type="text/event-stream", background=BackgroundTask(finish),
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await handle(request, "transcribe", "transcriptions")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await handle(request, "translate", "translations")

    return app


class _Segments:
    """A stream's segments, handed from the job's worker thread to the event loop in order. Segments
    that come before the stream starts reading wait in a list."""

    def __init__(self):
        self._lock = threading.Lock()
        self._early: list = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._queue: Optional[asyncio.Queue] = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        with self._lock:
            self._loop, self._queue = loop, asyncio.Queue()
            for item in self._early:
                self._queue.put_nowait(item)
            self._early = []
            return self._queue

    def put(self, item) -> None:  # any thread
        with self._lock:
            if self._loop is None:
                self._early.append(item)
                return
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass


def _submit(service, samples, options, sink: Optional[_Segments]):
    try:
        job = service.submit(samples, options, None if sink is None else sink.put)
    except EngineStopped:
        raise ApiError(503, "the server is shutting down", "server_error") from None
    except InvalidOptionError as exc:  # more beams or samples than the engine's rows hold
        raise ApiError(400, str(exc)) from None
    return job


async def _finished_or_gone(request: Request, job) -> bool:
    """Sleep until the job is done (True) or the client hangs up (False), whichever comes first."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    def wake(_future) -> None:  # on the thread that finished the job
        try:
            loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(None))
        except RuntimeError:  # the loop is closed
            pass

    job.future.add_done_callback(wake)
    gone = asyncio.ensure_future(_hung_up(request))
    try:
        await asyncio.wait((finished, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        finished.cancel()
    return job.done


async def _hung_up(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next message is the hang-up)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _UploadParser(MultiPartParser):
    """Starlette's multipart parser, keeping a file part in memory up to ``spool_max_size`` bytes.
    Every upload is read whole right after parsing anyway; spooled past Starlette's 1 MB, a file part
    goes to a temporary file a worker-thread write per chunk (a 19-MB WAV: 60-75 ms, against 6 ms in
    memory, while the event loop serves every other client)."""

    def __init__(self, *args, spool_max_size: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.spool_max_size = spool_max_size


async def _read_form(request: Request, limit: int):
    """The request's form: a multipart body parsed in memory up to ``limit`` bytes a file."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        return await request.form(max_files=1, max_fields=64)
    try:
        async with aclosing(request.stream()) as stream:
            return await _UploadParser(request.headers, stream, max_files=1, max_fields=64,
                                       spool_max_size=limit).parse()
    except MultiPartException as exc:
        raise ApiError(400, f"the multipart form cannot be read: {exc.message}") from None


def _counted(receive, limit: int):
    """``receive`` that raises _UploadTooLarge once the body passes ``limit`` bytes."""
    seen = 0

    async def counted():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _UploadTooLarge()
        return message
    return counted


async def _decode(data: bytes, sample_rate: int):
    try:
        return await asyncio.to_thread(load_audio, data, sample_rate)
    except AudioError as exc:
        raise ApiError(400, f"the uploaded file is not audio ostinato can read: {exc}", param="file") from None


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _warm_all(services: Dict[str, Any]) -> None:
    for name, service in services.items():
        try:
            service.warm_up()
        except Exception as exc:  # noqa: BLE001 - /ready stays 503 and says why in the log
            log.error("the warm-up of %s failed: %s: %s", name, type(exc).__name__, exc)


def _check_key(request: Request, api_key: Optional[str]) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    if header != f"Bearer {api_key}":
        raise ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)", "authentication_error",
                       code="invalid_api_key")


def _service(services: Dict[str, Any], requested) -> tuple:
    """The served id and service a request names: whisper-1 (or no model) is the first Whisper model;
    with none served, no model is the first model."""
    name = str(requested or WHISPER_ALIAS)
    if name == WHISPER_ALIAS and name not in services:
        for served, service in services.items():
            if service.family == "whisper":
                return served, service
        if not requested:
            return next(iter(services.items()))
    if name not in services:
        raise ApiError(404, f"the model '{name}' is not served here (GET /v1/models lists them)", param="model",
                       code="model_not_found")
    return name, services[name]


def _option_fields(form, task: str, family: str) -> Dict[str, Any]:
    unknown = sorted(set(form.keys()) - OPENAI_FIELDS - set(EXTRA_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown form field(s): {', '.join(unknown)}", param=unknown[0])
    include = [v for v in form.getlist("include[]") + form.getlist("include") if v]
    if include:
        raise ApiError(400, f"include[] is not available here (got {include[0]!r})", param="include[]")
    fields: Dict[str, Any] = {}
    if family == "whisper":
        fields["task"] = task
        if form.get("language"):
            fields["language"] = str(form.get("language"))  # the spoken language, translated or not
        if form.get("prompt"):
            fields["initial_prompt"] = str(form.get("prompt"))
        if form.get("temperature") not in (None, ""):  # one value: that one only; a, b, ...: a schedule
            try:
                fields["temperature"] = parse_temperature(str(form.get("temperature")))
            except InvalidOptionError as exc:
                raise ApiError(400, str(exc), param="temperature") from None
    else:
        given = [n for n in ("language", "prompt", "temperature") if form.get(n) not in (None, "")]
        if given or task != "transcribe":
            what = f"the field {given[0]}" if given else "translation"
            raise ApiError(400, f"a transducer model takes no {what} (Whisper's alone)", param=given[0] if given else None)
    for name, kind in EXTRA_FIELDS.items():
        if form.get(name) not in (None, ""):
            fields[name] = _typed(name, form.get(name), kind)
    return fields


def _typed(name: str, value, kind):
    text = str(value).strip()
    if name in NULLABLE and text.lower() in ("none", "null"):
        return None
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ApiError(400, f"{name} must be true or false, got {text!r}", param=name)
    if kind is dict:  # a JSON object, e.g. vad_parameters={"min_silence_duration_ms": 500}
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ApiError(400, f"{name} must be a JSON object, got {text!r}", param=name)
        return value
    if kind is list:  # token ids: "-1" or "1,2,3"
        try:
            return [int(part) for part in text.split(",")]
        except ValueError:
            raise ApiError(400, f"{name} must be comma-separated token ids, got {text!r}", param=name) from None
    try:
        return kind(text)
    except ValueError:
        raise ApiError(400, f"{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}",
                       param=name) from None


def _outcome(job) -> tuple:
    try:
        return job.result()
    except AudioError as exc:
        raise ApiError(400, f"the uploaded file is not audio ostinato can read: {exc}", param="file") from None
    except Cancelled:
        raise ApiError(503, "the transcription was cancelled (the server is stopping)", "server_error") from None
    except InvalidOptionError as exc:
        raise ApiError(400, str(exc)) from None
    except OstinatoError as exc:
        raise ApiError(500, f"the transcription failed: {exc}", "server_error") from None
