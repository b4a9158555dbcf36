"""The HTTP API (issue 6): OpenAI-compatible embeddings, jobs, health and metrics. FastAPI on uvicorn.

    from orchestrator.api.server import create_app, serve
    serve(Settings(input_roots=["/data/videos"]))          # what `pipeline serve` does

The server is a parent process like the CLI: it never imports a model
library. Embeddings are computed in spawned worker children
(``orchestrator.api.workers``), jobs run through the :class:`Orchestrator` in one
background thread (``orchestrator.api.jobs``). Every error is an OpenAI-style
``{"error": {"message", "type", "param", "code"}}`` without a stack trace.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security.utils import get_authorization_scheme_param
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts import EmbeddingsArtifact, TranscriptArtifact, load_artifact, load_model
from contracts.api import (
    EMBEDDED_MODEL_NAMES,
    PROFILES,
    EmbeddingObject,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ErrorDetail,
    ErrorResponse,
    Health,
    JobInputResult,
    JobRecord,
    JobRequest,
    JobResult,
)
from contracts.errors import ApiError, ArtifactError
from contracts.report import RunReport
from orchestrator.gpu.nvml import NvmlReader
from orchestrator.api.jobs import JobQueue
from orchestrator.api.metrics import CONTENT_TYPE, Metrics, ScrapeCollector
from orchestrator.settings import Settings
from orchestrator.api.workers import EmbeddingPool
from orchestrator.run.hub import resolve_hub
from orchestrator.run.pipeline import REPORT_NAME

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 413: "request_too_large",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error", 504: "timeout_error"}
#: documented error responses (OpenAPI)
ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 503)}
_ROUTES = ("/v1/embeddings", "/v1/jobs", "/health", "/metrics", "/openapi.json", "/docs")
#: paths answered without a token (liveness probes: status only, the detail needs the token)
OPEN_PATHS = frozenset({"/health"})
#: Host names a loopback server without a token answers (anything else may be DNS rebinding from a browser)
LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8000`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_loopback_host(header: str) -> bool:
    name = host_name(header).rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def error_body(status: int, message: str, type: str | None = None, param: str | None = None,
               code: str | None = None) -> bytes:
    detail = ErrorDetail(message=message, type=type or _TYPES.get(status, "server_error"), param=param, code=code)
    return ErrorResponse(error=detail).model_dump_json().encode()


def _error(status: int, message: str, type: str | None = None, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(status, message, type, param, code), status_code=status,
                    media_type="application/json", headers=headers)


def route_of(path: str) -> str:
    """A bounded label for metrics: the route template, not the raw path."""
    if path.startswith("/v1/jobs/"):
        return "/v1/jobs/{id}/result" if path.endswith("/result") else "/v1/jobs/{id}"
    return path if path in _ROUTES else "other"


class Guard:
    """ASGI middleware: Host check, bearer token, concurrency limit, request body limit, request metrics.

    Without a token on a loopback address, only Host headers naming loopback are answered (403
    otherwise): a web page the user visits cannot reach the API through DNS rebinding. Requests beyond
    ``max_concurrent_requests`` in flight are answered 429 before their body is read. Whether the
    request carried the token is left in ``scope["state"]["authorized"]`` (``/health`` shows its
    detail only then).

    The token is checked here rather than with a route dependency (``fastapi.security.HTTPBearer``)
    because it must also cover ``/openapi.json``, ``/docs`` and unknown paths, and come before the
    body is read (so an unauthenticated client cannot make the server buffer a large body); the
    header is parsed with FastAPI's own helper.
    """

    def __init__(self, app, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        token = settings.api_token.get_secret_value() if settings.api_token else ""
        self.expected = token.encode() if token else None
        self.max_body = settings.max_body_bytes
        self.metrics = metrics
        self.check_host = self.expected is None and settings.is_loopback()
        self.max_in_flight = settings.max_concurrent_requests
        self.retry_after = str(settings.retry_after_s)
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_seen = {"status": 500}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status_seen["status"] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(route=route_of(scope["path"]), method=scope["method"],
                                         status=str(status_seen["status"])).inc()

    async def _guarded(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        if self.check_host and not is_loopback_host(headers.get(b"host", b"").decode("latin-1")):
            log.warning("refused a request with Host %r: this server without a token answers loopback names only",
                        headers.get(b"host", b"").decode("latin-1")[:100])
            await _error(403, "this server answers only Host headers naming loopback (localhost, 127.0.0.1, [::1]) "
                              "unless it has a token", type="permission_error", code="host_not_allowed",
                         headers={"Connection": "close"})(scope, receive, send)
            return
        authorized = self.expected is None
        if not authorized:
            scheme, given = get_authorization_scheme_param(headers.get(b"authorization", b"").decode("latin-1"))
            authorized = scheme.lower() == "bearer" and hmac.compare_digest(given.encode("latin-1"), self.expected)
        if not authorized and scope["path"] not in OPEN_PATHS:
            await _error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                         code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        scope.setdefault("state", {})["authorized"] = authorized
        if scope["path"] in OPEN_PATHS:
            await self._body(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejected.labels(reason="concurrency").inc()
            await _error(429, f"too many requests in flight (more than {self.max_in_flight}); retry later",
                         code="too_many_requests", headers={"Retry-After": self.retry_after})(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self._body(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _body(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await self._too_large(scope, receive, send)
            return
        body, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._too_large(scope, receive, send)
                return
            body.append(chunk)
            more = message.get("more_body", False)
        whole = b"".join(body)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send) -> None:
        await _error(413, f"request body larger than {self.max_body} bytes", code="body_too_large",
                     headers={"Connection": "close"})(scope, receive, send)


def check_embedding_request(body: EmbeddingRequest, settings: Settings) -> tuple[str, list[str]]:
    """(worker profile, texts), or an :class:`ApiError` saying what was wrong."""
    texts = body.texts()
    if not texts:
        raise ApiError(400, "'input' must not be empty", type="invalid_request_error", param="input", code="empty_input")
    if len(texts) > settings.max_inputs:
        raise ApiError(400, f"too many inputs: {len(texts)} > {settings.max_inputs} per request",
                       type="invalid_request_error", param="input", code="too_many_inputs")
    for index, text in enumerate(texts):
        if not text:
            raise ApiError(400, f"input[{index}] is an empty string", type="invalid_request_error",
                           param=f"input[{index}]", code="empty_input")
        if len(text) > settings.max_input_chars:
            raise ApiError(400, f"input[{index}] is too long: {len(text)} characters > {settings.max_input_chars}",
                           type="invalid_request_error", param=f"input[{index}]", code="input_too_long")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in the JSON): no model can take it
            raise ApiError(400, f"input[{index}] is not valid Unicode ({exc.reason} at character {exc.start})",
                           type="invalid_request_error", param=f"input[{index}]", code="invalid_unicode") from None
    if body.model not in PROFILES and body.model not in settings.embedding_models:
        known = ", ".join(sorted(set(PROFILES) | set(settings.embedding_models)))
        raise ApiError(404, f"the model {body.model!r} does not exist on this server; use one of: {known}",
                       type="invalid_request_error", param="model", code="model_not_found")
    return body.model, texts


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body was read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for_rows(ticket, request: Request, settings: Settings, metrics: Metrics):
    """The ticket's rows; its queued texts are dropped when the client disconnects or the deadline passes."""
    rows = asyncio.wrap_future(ticket.future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({rows, gone}, timeout=settings.request_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if rows in done:
        return rows.result()
    reason = "the client disconnected" if gone in done else f"deadline of {settings.request_timeout_s:g}s passed"
    ticket.cancel(reason)
    rows.cancel()
    metrics.rejected.labels(reason="disconnect" if gone in done else "deadline").inc()
    if gone in done:
        raise ApiError(499, "client closed the request", code="client_closed")
    raise ApiError(504, f"the embeddings were not ready within the request deadline of {settings.request_timeout_s:g}s "
                        "(PIPELINE_REQUEST_TIMEOUT_S); its queued texts were dropped", type="timeout_error",
                   code="deadline_exceeded")


def embedding_response(vectors, tokens: list[int], model: str, encoding_format: str) -> EmbeddingResponse:
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    else:
        rows = vectors.tolist()
    total = int(sum(tokens))
    return EmbeddingResponse(data=[EmbeddingObject(index=i, embedding=row) for i, row in enumerate(rows)],
                             model=model, usage=EmbeddingUsage(prompt_tokens=total, total_tokens=total))


def model_name(model: str) -> str:
    """A model as answers name it: a hub id, never a path on the server (the embedding worker's
    ``public_name`` does the same child-side)."""
    for directory, name in EMBEDDED_MODEL_NAMES.items():
        if model.rstrip("/").endswith(directory):
            return name
    return Path(model).name if Path(model).is_absolute() else model


def job_result(record: JobRecord, include_vectors: bool) -> JobResult:
    """The transcripts and embeddings of a finished job, read back from its validated artifacts."""
    import numpy as np

    report = None
    report_path = Path(record.output_dir) / REPORT_NAME
    if report_path.exists():
        report = load_model(report_path, RunReport)
    by_id = {i.id: i for i in report.inputs} if report else {}
    inputs = []
    for item in record.inputs:
        done = by_id.get(item.id)
        result = JobInputResult(id=item.id, source=item.source, status=done.status if done else item.status,
                                error=done.error if done else item.error, outputs=done.outputs if done else {})
        if done is not None and done.status in ("ok", "partial"):
            directory = Path(record.output_dir) / item.id
            transcript = load_artifact(directory / "transcript.json", TranscriptArtifact)
            transcript = transcript.model_copy(update={"model": model_name(transcript.model),
                                                       "requested_model": model_name(transcript.requested_model)})
            embeddings = load_artifact(directory / "embeddings.json", EmbeddingsArtifact)
            embeddings = embeddings.model_copy(update={"model": model_name(embeddings.model),
                                                       "requested_model": model_name(embeddings.requested_model)})
            vectors = np.load(directory / embeddings.sidecar, allow_pickle=False).tolist() if include_vectors else None
            result = result.model_copy(update={
                "transcript": transcript, "embeddings": embeddings, "vectors": vectors,
                "text": " ".join(s.text for s in transcript.segments)})
        inputs.append(result)
    return JobResult(id=record.id, status=record.status, inputs=inputs)


def create_app(settings: Settings, pool: EmbeddingPool | None = None) -> FastAPI:
    """The FastAPI application; raises :class:`SettingsError` for a non-loopback host without a token."""
    settings.check_serve()
    settings = resolve_hub(settings)  # allow_hub=auto: decided once, at start (workers load models later)
    metrics = pool.metrics if pool is not None else Metrics()
    pool = pool or EmbeddingPool(settings, metrics)
    jobs = JobQueue(settings)
    gpu = NvmlReader()
    metrics.registry.register(ScrapeCollector(jobs.counts, lambda: jobs.queued, lambda: _gpu_memory(pool, gpu)))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        jobs.start()
        log.info("API ready: embeddings (max batch %d, max wait %.1f ms, idle stop %.0f s), jobs in %s, input roots %s",
                 settings.embed_max_batch, settings.embed_max_wait_ms, settings.worker_idle_s, jobs.directory,
                 [str(r) for r in settings.input_roots] or "none (jobs refused)")
        try:
            yield
        finally:
            await asyncio.to_thread(jobs.close)
            await asyncio.to_thread(pool.close)

    app = FastAPI(title="isostage API", version="1", lifespan=lifespan,
                  description="Embeddings (OpenAI-compatible) and transcription jobs; every model runs in an "
                              "isolated child process.")
    app.state.settings, app.state.pool, app.state.jobs, app.state.metrics = settings, pool, jobs, metrics

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        headers = {"Retry-After": str(settings.retry_after_s)} if exc.status == 429 else None
        return _error(exc.status, exc.message, exc.type if exc.type != "server_error" or exc.status >= 500 else None,
                      exc.param, exc.code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return _error(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return _error(400, "the request body is not valid JSON", code="invalid_json")
        if loc and loc[0] == "input" and request.url.path == "/v1/embeddings":
            return _error(400, "'input' must be a string or a list of strings (token arrays are not supported)",
                          param="input", code="invalid_input")
        param = ".".join(loc) or None
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return _error(400, f"{param or 'body'}: {first.get('msg')}{more}", param=param, code="invalid_request")

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error(500, "internal server error (details are in the server's log)", code="internal_error")

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        """OpenAI-compatible embeddings; ``model`` is a profile (speed, quality, embedded) or a configured name.

        429 (Retry-After) when the profile's queue is full; 504 past the request deadline. A client that
        disconnects has its queued texts dropped."""
        profile, texts = check_embedding_request(body, settings)
        result = await wait_for_rows(pool.ticket(profile, texts), request, settings, metrics)
        response = embedding_response(result.vectors, result.tokens, result.model, body.encoding_format)
        return Response(response.model_dump_json(), media_type="application/json")

    @app.post("/v1/jobs", status_code=202, response_model=JobRecord, responses={**ERRORS, 403: {"model": ErrorResponse},
                                                                                 422: {"model": ErrorResponse}})
    async def submit_job(body: JobRequest) -> JobRecord:
        """Queue files or directories (inside the server's input roots) for transcription and embeddings."""
        return await asyncio.to_thread(jobs.submit, body.paths)

    @app.get("/v1/jobs/{job_id}", response_model=JobRecord, responses=ERRORS)
    async def get_job(job_id: str) -> JobRecord:
        """Status, per-input progress and the run report's summary."""
        return await asyncio.to_thread(jobs.get, job_id)

    @app.get("/v1/jobs/{job_id}/result", response_model=JobResult, responses={**ERRORS, 409: {"model": ErrorResponse}})
    async def get_result(job_id: str, embeddings: bool = Query(False, description="include the vectors")) -> Response:
        """Transcripts and embeddings of a finished job (409 while it is queued or running)."""
        record = await asyncio.to_thread(jobs.get, job_id)
        if record.status in ("queued", "running"):
            raise ApiError(409, f"job {job_id} is {record.status}; its result is not ready",
                           type="conflict_error", code="job_not_finished")
        try:
            result = await asyncio.to_thread(job_result, record, embeddings)
        except ArtifactError as exc:
            raise ApiError(500, f"an output of job {job_id} is unreadable: {exc.reason}", code="bad_output") from exc
        return Response(result.model_dump_json(), media_type="application/json")

    @app.get("/health", response_model=Health, response_model_exclude_none=True)
    async def health(request: Request) -> Response:
        """Liveness (open without a token); the workers and the job queue only with the token."""
        if not request.scope.get("state", {}).get("authorized"):
            return Response(Health().model_dump_json(exclude_none=True), media_type="application/json")
        detail = Health(workers=pool.health(), jobs_queued=jobs.queued, job_running=jobs.running)
        return Response(detail.model_dump_json(exclude_none=True), media_type="application/json")

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        """Prometheus text format."""
        page = await asyncio.to_thread(metrics.render)  # the scrape collector reads NVML: off the event loop
        return Response(page, media_type=CONTENT_TYPE)

    app.add_middleware(Guard, settings=settings, metrics=metrics)
    return app


def _gpu_memory(pool: EmbeddingPool, gpu: NvmlReader):
    """(gpu index, used MiB, total MiB, {worker profile: MiB}) per device NVML sees; nothing without NVML."""
    snapshot = gpu.read()
    if not snapshot.available:
        return
    pids = {w.pid: w.profile for w in pool.workers() if w.pid is not None}
    for d in snapshot.devices:
        held = {pids[p.pid]: p.used_mib or 0.0 for p in d.processes if p.pid in pids}
        yield str(d.index), d.used_mib, d.total_mib, held


def uvicorn_config(app, settings: Settings, **extra):
    import uvicorn

    return uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                          timeout_graceful_shutdown=30, **extra)


def serve(settings: Settings) -> None:
    """Run the API in this process until Ctrl-C / SIGTERM (the jobs' children finish their item first)."""
    import uvicorn

    uvicorn.Server(uvicorn_config(create_app(settings), settings)).run()


@dataclass
class RunningServer:
    """A server in a background thread of this process (tests, benchmarks)."""

    url: str
    app: FastAPI
    stop: Callable[[], None]


def start_in_thread(settings: Settings, pool: EmbeddingPool | None = None, timeout_s: float = 30.0) -> RunningServer:
    """Start uvicorn on ``settings.host`` and an ephemeral port (``port=0``) in a thread; return its URL."""
    import uvicorn

    app = create_app(settings, pool)
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    server = uvicorn.Server(uvicorn_config(app, settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def stop() -> None:
        server.should_exit = True
        thread.join()
        sock.close()

    return RunningServer(url=url, app=app, stop=stop)


__all__ = ["RunningServer", "create_app", "serve", "start_in_thread"]
