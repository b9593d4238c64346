"""The HTTP side: OpenAI's audio endpoints, models, health, readiness, metrics and a page.

Handlers parse, validate and submit; the services' engine threads do all device work. Every
refusal is an OpenAI-style JSON error; uploads are read in memory and dropped with the request.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..audio import load_audio
from ..errors import AudioError, InvalidOptionError, OstinatoError
from ..models.whisper.engine import Cancelled, EngineStopped
from .errors import ApiError
from .formats import FORMATS, render
from .metrics import Metrics

WHISPER_ALIAS = "whisper-1"

# Form fields beyond OpenAI's that reach the options, as vLLM takes extra parameters; name -> type.
EXTRA_FIELDS = {
    "beam_size": int, "best_of": int, "patience": float, "length_penalty": float, "repetition_penalty": float,
    "no_repeat_ngram_size": int, "condition_on_previous_text": bool, "prompt_reset_on_temperature": float,
    "compression_ratio_threshold": float, "log_prob_threshold": float, "no_speech_threshold": float,
    "suppress_blank": bool, "max_initial_timestamp": float, "max_new_tokens": int, "word_timestamps": bool,
    "without_timestamps": bool, "hallucination_silence_threshold": float, "prefix": str, "hotwords": str,
    "clip_timestamps": str, "seed": int, "max_symbols": int,
}
OPENAI_FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature",
                 "timestamp_granularities[]", "timestamp_granularities", "stream"}


def create_app(services: Dict[str, Any], *, api_key: Optional[str] = None, max_upload_mb: float = 25.0,
               max_queue: int = 64) -> FastAPI:
    """``services``: served id -> a service of ``services.py`` (already started)."""
    metrics = Metrics()
    max_bytes = int(max_upload_mb * 1024 * 1024)
    admitted = {name: 0 for name in services}  # requests past the queue check and not answered yet

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        warmer = threading.Thread(target=_warm_all, args=(services,), name="ostinato-warm-up", daemon=True)
        warmer.start()
        yield
        # uvicorn has stopped taking requests and let the ones in flight finish: drain and stop
        for service in services.values():
            await asyncio.to_thread(service.shutdown)

    app = FastAPI(title="ostinato", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

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
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes + 64 * 1024:
            raise ApiError(413, f"the upload is larger than {max_upload_mb:g} MB", code="file_too_large")
        form = await request.form(max_files=1, max_fields=64)
        try:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise ApiError(400, "the form needs a 'file' field holding the audio", param="file")
            data = await upload.read(max_bytes + 1)
        finally:
            await form.close()  # the spooled upload goes with the request
        if len(data) > max_bytes:
            raise ApiError(413, f"the upload is larger than {max_upload_mb:g} MB", code="file_too_large")
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
        words = "word" in granularities
        if words:
            if service.family != "whisper":
                raise ApiError(400, "word timestamps need a Whisper model", param="timestamp_granularities[]")
            fields["word_timestamps"] = True
        try:
            options = service.options(**fields)
        except InvalidOptionError as exc:
            raise ApiError(400, str(exc)) from None
        # Counted here, in the event loop's one thread, from the check until the answer: requests that
        # arrive together cannot all slip past it while their audio decodes.
        if admitted[name] >= max_queue:
            raise ApiError(429, "too many requests in the queue: try again shortly", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        admitted[name] += 1
        handed_over = False
        try:
            stream = str(form.get("stream") or "false").lower() in ("true", "1")
            samples = await _decode(data)
            del data
            if stream:
                handed_over = True  # the stream gives the place back when it ends
                return StreamingResponse(_events(service, samples, options, name), media_type="text/event-stream")
            return await _answer(request, service, samples, options, name, fmt, task, words)
        finally:
            if not handed_over:
                admitted[name] -= 1

    async def _answer(request, service, samples, options, name, fmt, task, words) -> Response:
        try:
            job = service.submit(samples, options)
        except EngineStopped:
            raise ApiError(503, "the server is shutting down", "server_error") from None
        # Waiting is polling, and every poll takes the interpreter lock from the engine thread: the job
        # is looked at every 20 ms, the connection (a costlier look) every 0.5 s.
        polls = 0
        while not job.done:
            polls += 1
            if polls % 25 == 0 and await request.is_disconnected():
                job.cancel()  # its rows go back to the others at once
                return Response(status_code=499)
            await asyncio.sleep(0.02)
        segments, info = _outcome(job)
        metrics.audio.labels(name).inc(info.duration)
        body, media = render(segments, info, fmt, task, words)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media)

    async def _events(service, samples, options, name):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        try:
            job = service.submit(samples, options, lambda segment: loop.call_soon_threadsafe(queue.put_nowait, segment))
        except EngineStopped:
            admitted[name] -= 1
            yield _event({"type": "error", "error": ApiError(503, "the server is shutting down").body()["error"]})
            return
        sent = 0
        try:
            while not (job.done and queue.empty()):
                try:
                    segment = await asyncio.wait_for(queue.get(), 0.05)
                except asyncio.TimeoutError:
                    continue
                sent += 1
                yield _event({"type": "transcript.text.delta", "delta": segment.text})
            try:
                segments, info = _outcome(job)
            except ApiError as exc:
                yield _event({"type": "error", "error": exc.body()["error"]})
                return
            for segment in segments[sent:]:  # any the callbacks had not delivered yet
                yield _event({"type": "transcript.text.delta", "delta": segment.text})
            metrics.audio.labels(name).inc(info.duration)
            yield _event({"type": "transcript.text.done", "text": "".join(s.text for s in segments).strip()})
        finally:
            admitted[name] -= 1
            if not job.done:
                job.cancel()  # the client went away: free its rows

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await handle(request, "transcribe", "transcriptions")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await handle(request, "translate", "translations")

    return app


async def _decode(data: bytes):
    try:
        return await asyncio.to_thread(load_audio, data)
    except AudioError as exc:
        raise ApiError(400, f"the uploaded file is not audio ostinato can read: {exc}", param="file") from None


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _warm_all(services: Dict[str, Any]) -> None:
    for service in services.values():
        service.warm_up()


def _check_key(request: Request, api_key: Optional[str]) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    if header != f"Bearer {api_key}":
        raise ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)", "authentication_error",
                       code="invalid_api_key")


def _service(services: Dict[str, Any], requested) -> tuple:
    name = str(requested or WHISPER_ALIAS)
    if name == WHISPER_ALIAS:
        for served, service in services.items():
            if service.family == "whisper":
                return served, service
    if name not in services:
        raise ApiError(404, f"the model '{name}' is not served here (GET /v1/models lists them)", param="model",
                       code="model_not_found")
    return name, services[name]


def _option_fields(form, task: str, family: str) -> Dict[str, Any]:
    unknown = sorted(set(form.keys()) - OPENAI_FIELDS - set(EXTRA_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown form field(s): {', '.join(unknown)}", param=unknown[0])
    fields: Dict[str, Any] = {}
    if family == "whisper":
        fields["task"] = task
        if form.get("language") and task == "transcribe":
            fields["language"] = str(form.get("language"))
        if form.get("prompt"):
            fields["initial_prompt"] = str(form.get("prompt"))
        if form.get("temperature") not in (None, ""):
            fields["temperature"] = _typed("temperature", form.get("temperature"), float)  # that one only
    elif any(form.get(name) not in (None, "") for name in ("language", "prompt", "temperature")) or task != "transcribe":
        raise ApiError(400, "a transducer model takes no language, prompt, temperature or translation")
    for name, kind in EXTRA_FIELDS.items():
        if form.get(name) not in (None, ""):
            fields[name] = _typed(name, form.get(name), kind)
    return fields


def _typed(name: str, value, kind):
    text = str(value).strip()
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ApiError(400, f"{name} must be true or false, got {text!r}", param=name)
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
