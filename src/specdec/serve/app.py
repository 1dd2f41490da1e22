"""The Starlette application: routes, the API key, the body limit, errors as OpenAI's JSON.

POST /v1/completions and /v1/chat/completions (streamed as server-sent events or not), GET
/v1/models, /health (503 while the model loads) and /metrics (Prometheus). With an API key every
route but /health needs `Authorization: Bearer KEY`. Requests from web pages are refused unless
their origin is allowed (serve.security). Whatever a client sends, the reply is JSON (an error
body with a 4xx status where the request is at fault) and the server goes on; a fault of the
server's own is a 500 whose body names an id the log carries, never the exception's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .body import read_json
from .errors import ApiError, internal
from .job import Failed, Finished, Job, Tokens
from .metrics import CONTENT_TYPE
from .request import CHAT, COMPLETIONS, read_request
from .respond import Reply
from .security import SiteGuard, Sites
from .worker import DecodeWorker

OPEN_PATHS = ("/health",)  # answered without the API key


@dataclass(frozen=True)
class Settings:
    api_key: str | None = None
    max_body_bytes: int = 8 << 20
    sites: Sites = field(default_factory=Sites)  # the web origins and Host names answered


def create_app(worker: DecodeWorker, settings: Settings) -> Starlette:
    async def completions(request: Request) -> Response:
        return await _complete(request, COMPLETIONS)

    async def chat(request: Request) -> Response:
        return await _complete(request, CHAT)

    async def _complete(request: Request, api: str) -> Response:
        try:
            body = await read_json(request, settings.max_body_bytes)
        except ApiError as error:  # counted as every refusal is, so /metrics accounts for each request
            worker.metrics.reject("too_large" if error.status == 413 else "invalid")
            raise
        if worker.state != "ready":
            worker.metrics.reject("loading" if worker.state == "loading" else "unavailable")
            raise worker.not_ready()
        try:
            generation = await run_in_threadpool(read_request, body, api, worker.model, worker.encode_text,
                                                 worker.encode_chat)
        except ApiError:
            worker.metrics.reject("invalid")
            raise
        job = Job(generation, asyncio.get_running_loop())
        worker.submit(job)
        reply = Reply(generation, worker.name)
        if generation.stream:
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(_events(request, job, reply), media_type="text/event-stream", headers=headers)
        return await _whole(request, job, reply)

    async def models(request: Request) -> Response:
        if worker.state != "ready":
            raise worker.not_ready()
        model = worker.model
        entry = {"id": model.name, "object": "model", "created": 0, "owned_by": "specdec",
                 "max_model_len": model.context, "meta": {"method": worker.loaded.method,
                                                          "vocab_size": model.vocab_size}}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        if worker.state == "ready":
            return JSONResponse({"status": "ok"})
        error = worker.not_ready()
        return JSONResponse({"status": worker.state, **error.body()}, status_code=503, headers=error.headers)

    async def metrics(request: Request) -> Response:
        return Response(worker.metrics.text(), media_type=CONTENT_TYPE)

    async def on_api_error(request: Request, error: ApiError) -> Response:
        return error.response()

    async def on_http_error(request: Request, error: HTTPException) -> Response:
        message = {404: f"no such route: {request.url.path} (POST /v1/completions, /v1/chat/completions; GET "
                        "/v1/models, /health, /metrics)",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(error.status_code, error.detail)
        return ApiError(error.status_code, message, code="not_found" if error.status_code == 404 else None).response()

    async def on_crash(request: Request, error: Exception) -> Response:  # a middleware's fault: the last resort
        return internal(error).response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        worker.stop()
        await run_in_threadpool(worker.join, 30.0)

    routes = [
        Route("/v1/completions", _guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", _guarded(chat), methods=["POST"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
        Route("/health", _guarded(health), methods=["GET"]),
        Route("/metrics", _guarded(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: on_api_error, HTTPException: on_http_error, Exception: on_crash})
    if settings.api_key:
        app.add_middleware(ApiKey, key=settings.api_key, metrics=worker.metrics)
    # The last added runs first: the Origin and Host check, then CORS (preflights carry no API key).
    if settings.sites.origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.sites.origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], max_age=600)
    app.add_middleware(SiteGuard, sites=settings.sites, metrics=worker.metrics)
    return app


def _guarded(endpoint):
    """The route with its own faults answered as a 500 that names an id (errors.internal), so the
    body holds no exception text; ApiErrors and Starlette's HTTP errors pass as they are."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (ApiError, HTTPException):
            raise
        except Exception as e:  # noqa: BLE001 - answered, logged with its id
            raise internal(e) from None

    return guarded


class ApiKey:
    """ASGI middleware: `Authorization: Bearer KEY` on every route but /health, else 401."""

    def __init__(self, app, key: str, metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return await self.app(scope, receive, send)
        self.metrics.reject("unauthorized")
        error = ApiError(401, "missing or wrong API key: send the header Authorization: Bearer KEY with the key the "
                              "server was started with (--api-key or SPECDEC_API_KEY)", code="invalid_api_key",
                         headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)


async def _watch(request: Request, job: Job) -> None:
    """Cancel the job when the client disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _whole(request: Request, job: Job, reply: Reply) -> Response:
    watcher = asyncio.create_task(_watch(request, job))
    deltas, ends = [[] for _ in range(job.generation.n)], {}  # per choice
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, Tokens):
                deltas[event.index].extend(event.deltas)
            elif isinstance(event, Finished):
                ends[event.index] = event
                if len(ends) == len(deltas):
                    return JSONResponse(reply.whole([ends[i] for i in range(len(deltas))], deltas))
            elif isinstance(event, Failed):
                raise event.error
    finally:
        watcher.cancel()
        job.cancel()  # a no-op when it finished; stops it when this handler is cancelled


async def _events(request: Request, job: Job, reply: Reply):
    """The server-sent events of a streamed reply; the job is cancelled when the stream stops
    early (the client went away)."""
    watcher = asyncio.create_task(_watch(request, job))
    try:
        while True:
            event = await job.events.get()
            if isinstance(event, Tokens):
                for chunk in reply.chunks(event.deltas, event.index) if event.deltas else ():
                    yield _sse(chunk)
            elif isinstance(event, Finished):
                for chunk in reply.last_chunks(event, event.index):
                    yield _sse(chunk)
                if reply.done:  # every choice ended
                    break
            elif isinstance(event, Failed):
                yield _sse(event.error.body())
                break
        yield b"data: [DONE]\n\n"
    finally:
        watcher.cancel()
        job.cancel()


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
