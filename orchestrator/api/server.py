"""The HTTP API: OpenAI-compatible embeddings, jobs, transcriptions, health and metrics. FastAPI on uvicorn.

    from orchestrator.api.server import create_app, serve
    serve(Settings(input_roots=["/data/videos"]))          # what `pipeline serve` does

The server is a parent process like the CLI: it never imports a model
library. Embeddings are computed in spawned worker children
(``orchestrator.api.workers``), jobs run through the :class:`Orchestrator` in one
background thread (``orchestrator.api.jobs``). Every request passes the ASGI guard
first (``orchestrator.api.guard``); transcriptions are answered in OpenAI's formats by
``orchestrator.api.transcriptions``. Every error is an OpenAI-style
``{"error": {"message", "type", "param", "code"}}`` without a stack trace
(``orchestrator.api.errors``). This module creates the app and holds the routes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts import EmbeddingsArtifact, TranscriptArtifact, load_artifact, load_model
from contracts.api import (
    CHANNEL_MODES,
    EMBEDDED_MODEL_NAME,
    EMBEDDING_DIMENSIONS,
    FINISHED,
    PROFILES,
    TRANSCRIPTION_FORMATS,
    EmbeddingObject,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ErrorResponse,
    Health,
    JobInput,
    JobInputResult,
    JobRecord,
    JobRequest,
    JobResult,
    ModelCard,
    ModelList,
    SearchRequest,
    SearchResponse,
    TranscriptionVerbose,
    WorkerHealth,
)
from contracts.errors import ApiError, ArtifactError
from contracts.models import EMBEDDING_PROFILES
from contracts.report import RunReport
from orchestrator.api.admission import LoopLag, refusal
from orchestrator.api.errors import error_response
from orchestrator.api.guard import TRANSCRIPTIONS, UPLOAD_RESERVED, Guard
from orchestrator.api.jobs import UPLOAD_DIR, JobQueue
from orchestrator.api.metrics import CONTENT_TYPE, Metrics, ScrapeCollector
from orchestrator.api.search import run_search, search_page
from orchestrator.api.transcriptions import form_text, model_name, redact, save_upload, transcription_answer
from orchestrator.api.workers import EmbeddingPool
from orchestrator.corpus.captions import CaptionRules
from orchestrator.gpu.nvml import NvmlReader
from orchestrator.models.hub import resolve_hub
from orchestrator.run.pipeline import REPORT_NAME
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: documented error responses (OpenAPI)
ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 503)}


def check_embedding_request(body: EmbeddingRequest, settings: Settings) -> tuple[str, list[str]]:
    """(worker profile, texts), or an :class:`ApiError` saying what was wrong."""
    texts = body.texts()
    if not texts:
        raise ApiError(
            400, "'input' must not be empty", type="invalid_request_error", param="input", code="empty_input"
        )
    if len(texts) > settings.max_inputs:
        raise ApiError(
            400,
            f"too many inputs: {len(texts)} > {settings.max_inputs} per request",
            type="invalid_request_error",
            param="input",
            code="too_many_inputs",
        )
    for index, text in enumerate(texts):
        if not text:
            raise ApiError(
                400,
                f"input[{index}] is an empty string",
                type="invalid_request_error",
                param=f"input[{index}]",
                code="empty_input",
            )
        if len(text) > settings.max_input_chars:
            raise ApiError(
                400,
                f"input[{index}] is too long: {len(text)} characters > {settings.max_input_chars}",
                type="invalid_request_error",
                param=f"input[{index}]",
                code="input_too_long",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in the JSON): no model can take it
            raise ApiError(
                400,
                f"input[{index}] is not valid Unicode ({exc.reason} at character {exc.start})",
                type="invalid_request_error",
                param=f"input[{index}]",
                code="invalid_unicode",
            ) from None
    if body.model not in PROFILES and body.model not in settings.embedding_models:
        raise unknown_model(body.model, sorted(set(PROFILES) | set(settings.embedding_models)))
    return body.model, texts


def unknown_model(name: str, known: list[str]) -> ApiError:
    """404 in OpenAI's shape for a model this server does not serve, naming those it does."""
    return ApiError(
        404,
        f"the model {name!r} does not exist on this server; use one of: {', '.join(known)}",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


#: the name /v1/models gives the transcription model (any name is taken: OpenAI's is listed)
TRANSCRIPTION_MODEL_ID = "whisper-1"


def model_cards(settings: Settings, workers: list[WorkerHealth], created: int) -> list[ModelCard]:
    """What ``GET /v1/models`` lists: each embedding profile and configured model name (by the name a
    request sends; a configured path is left out, answers name no path on the server) with the model it
    names, its dimensions where known and the model its worker runs now; then the transcription model.
    Read from the settings and the workers' health: nothing is loaded."""
    running = {w.profile: w for w in workers if w.running}
    names = {"speed": EMBEDDING_PROFILES["speed"], "quality": EMBEDDING_PROFILES["quality"]}
    names["embedded"] = EMBEDDED_MODEL_NAME
    for name in settings.embedding_models:
        if not (Path(name).is_absolute() or name.startswith((".", "~"))):
            names.setdefault(name, name.split("@", 1)[0])
    cards = []
    for profile, model in names.items():
        worker = running.get(profile)
        cards.append(
            ModelCard(
                id=profile,
                created=created,
                kind="embeddings",
                model=model,
                dimensions=EMBEDDING_DIMENSIONS.get(model),
                running_model=worker.model if worker else None,
                running_dimensions=worker.dimension if worker else None,
            )
        )
    asr = model_name(str(settings.asr_model))
    cards.append(ModelCard(id=TRANSCRIPTION_MODEL_ID, created=created, kind="transcriptions", model=asr))
    return cards


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body was read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for_rows(ticket, request: Request, settings: Settings, metrics: Metrics):
    """The ticket's rows; its queued texts are dropped when the client disconnects or the deadline passes."""
    rows = asyncio.wrap_future(ticket.future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {rows, gone}, timeout=settings.request_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if rows in done:
        return rows.result()
    reason = (
        "the client disconnected" if gone in done else f"deadline of {settings.request_timeout_s:g}s passed"
    )
    ticket.cancel(reason)
    rows.cancel()
    metrics.rejected.labels(reason="disconnect" if gone in done else "deadline").inc()
    if gone in done:
        raise ApiError(499, "client closed the request", code="client_closed")
    raise ApiError(
        504,
        f"the embeddings were not ready within the request deadline of {settings.request_timeout_s:g}s "
        "(PIPELINE_REQUEST_TIMEOUT_S); its queued texts were dropped",
        type="timeout_error",
        code="deadline_exceeded",
    )


#: answers a request that named an ``input_type``: "true" or "false" (did it change what the model saw)
INPUT_TYPE_HEADER = "X-Input-Type-Applied"


def embedding_response(
    vectors, tokens: list[int], model: str, encoding_format: str, input_type_applied: bool | None = None
) -> EmbeddingResponse:
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    else:
        rows = vectors.tolist()
    total = int(sum(tokens))
    return EmbeddingResponse(
        data=[EmbeddingObject(index=i, embedding=row) for i, row in enumerate(rows)],
        model=model,
        usage=EmbeddingUsage(prompt_tokens=total, total_tokens=total),
        input_type_applied=input_type_applied,
    )


def _input_result(record: JobRecord, item: JobInput, done, include_vectors: bool) -> JobInputResult:
    """One input's result, read back from its validated artifacts (its vectors only when asked)."""
    import numpy as np

    result = JobInputResult(
        id=item.id,
        source=item.source,
        status=done.status if done else item.status,
        error=done.error if done else item.error,
        outputs=done.outputs if done else {},
    )
    if done is None or done.status not in ("ok", "partial"):
        return result
    directory = Path(record.output_dir) / item.id
    transcript = load_artifact(directory / "transcript.json", TranscriptArtifact)
    transcript = transcript.model_copy(
        update={
            "model": model_name(transcript.model),
            "requested_model": model_name(transcript.requested_model),
        }
    )
    embeddings = load_artifact(directory / "embeddings.json", EmbeddingsArtifact)
    embeddings = embeddings.model_copy(
        update={
            "model": model_name(embeddings.model),
            "requested_model": model_name(embeddings.requested_model),
        }
    )
    vectors = (
        np.load(directory / embeddings.sidecar, allow_pickle=False).tolist() if include_vectors else None
    )
    return result.model_copy(
        update={
            "transcript": transcript,
            "embeddings": embeddings,
            "vectors": vectors,
            "text": " ".join(s.text for s in transcript.segments),
        }
    )


def job_result_chunks(record: JobRecord, include_vectors: bool) -> Iterator[bytes]:
    """A finished job's :class:`JobResult` as JSON, written one input at a time: the response streams
    (chunked), and only one input's transcript and vectors are in memory at once, whatever the job's size.
    An unreadable output ends the input's entry with its error instead of failing the whole answer."""
    report_path = Path(record.output_dir) / REPORT_NAME
    report = load_model(report_path, RunReport) if report_path.exists() else None
    by_id = {i.id: i for i in report.inputs} if report else {}
    head = JobResult(id=record.id, status=record.status, inputs=[]).model_dump_json()
    yield head[: -len("[]}")].encode() + b"["
    for number, item in enumerate(record.inputs):
        try:
            result = _input_result(record, item, by_id.get(item.id), include_vectors)
        except ArtifactError as exc:
            log.error("job %s: %s", record.id, exc)
            result = JobInputResult(
                id=item.id,
                source=item.source,
                status="failed",
                error=f"an output of this input is unreadable: {exc.reason}",
            )
        yield (b"," if number else b"") + result.model_dump_json().encode()
    yield b"]}"


def create_app(settings: Settings, pool: EmbeddingPool | None = None) -> FastAPI:
    """The FastAPI application; raises :class:`SettingsError` for a non-loopback host without a token, and
    :class:`OutputBusyError` when another server owns ``server_dir``."""
    settings.check_serve()
    settings = resolve_hub(settings)  # allow_hub=auto: decided once, at start (workers load models later)
    jobs = JobQueue(settings)
    jobs.claim()  # one server per state folder: a second one stops here, naming the holder
    metrics = pool.metrics if pool is not None else Metrics()
    pool = pool or EmbeddingPool(settings, metrics)
    gpu = NvmlReader()
    metrics.registry.register(
        ScrapeCollector(jobs.counts, lambda: jobs.queued, lambda: _gpu_memory(pool, gpu))
    )

    loop_lag = LoopLag()
    #: the server's own folders as answers name them (never the path itself)
    private = {str(Path(settings.server_dir)): "the server's state folder"}

    async def watch_loop(tick_s: float = 0.1) -> None:
        """How late the event loop runs this timer: admission counts it as work ahead of every request."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(tick_s)
            loop_lag.observe(time.monotonic() - t0 - tick_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        jobs.start()
        watcher = asyncio.create_task(watch_loop())
        log.info(
            "API ready: embeddings (max batch %d, max wait %.1f ms, idle stop %.0f s), jobs in %s, input roots %s",
            settings.embed_max_batch,
            settings.embed_max_wait_ms,
            settings.worker_idle_s,
            jobs.directory,
            [str(r) for r in settings.input_roots] or "none (jobs refused)",
        )
        try:
            yield
        finally:
            watcher.cancel()
            await asyncio.to_thread(jobs.close)
            await asyncio.to_thread(pool.close)

    app = FastAPI(
        title="isostage API",
        version="1",
        lifespan=lifespan,
        description="Embeddings (OpenAI-compatible) and transcription jobs; every model runs in an "
        "isolated child process.",
    )
    app.state.settings, app.state.pool, app.state.jobs, app.state.metrics = settings, pool, jobs, metrics
    app.state.loop_lag = loop_lag

    @app.exception_handler(ApiError)
    async def _apierror_response(request, exc: ApiError):
        headers = (
            {"Retry-After": str(exc.retry_after or settings.retry_after_s)} if exc.status == 429 else None
        )
        return error_response(
            exc.status,
            redact(exc.message, private),
            exc.type if exc.type != "server_error" or exc.status >= 500 else None,
            exc.param,
            exc.code,
            headers=headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _httperror_response(request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", code="invalid_json")
        if loc and loc[0] == "input" and request.url.path == "/v1/embeddings":
            return error_response(
                400,
                "'input' must be a string or a list of strings: token arrays are not supported (the "
                "server's models have their own tokenizers). LangChain's OpenAIEmbeddings sends them by "
                "default: pass check_embedding_ctx_length=False",
                param="input",
                code="invalid_input",
            )
        param = ".".join(loc) or None
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return error_response(
            400, f"{param or 'body'}: {first.get('msg')}{more}", param=param, code="invalid_request"
        )

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(
            500, "internal server error (details are in the server's log)", code="internal_error"
        )

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        """OpenAI-compatible embeddings; ``model`` is a profile (speed, quality, embedded) or a configured name.

        429 (Retry-After) when the profile's queue is full; 504 past the request deadline. A client that
        disconnects has its queued texts dropped."""
        profile, texts = check_embedding_request(body, settings)
        ticket = pool.ticket(profile, texts, loop_lag.seconds, body.input_type)
        result = await wait_for_rows(ticket, request, settings, metrics)
        applied = result.input_type_applied if body.input_type else None
        answer = embedding_response(
            result.vectors, result.tokens, result.model, body.encoding_format, applied
        ).model_dump_json(exclude_none=True)
        arrived = request.scope.get("state", {}).get("arrived")
        if arrived is not None:
            ticket.worker.answered(ticket, time.monotonic() - arrived)
        headers = None if applied is None else {INPUT_TYPE_HEADER: str(applied).lower()}
        return Response(answer, media_type="application/json", headers=headers)

    started = int(time.time())

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS)
    async def list_models() -> ModelList:
        """OpenAI's model list: the embedding profiles and configured models (their models, dimensions and
        the model each worker runs now) and the transcription model."""
        return ModelList(data=model_cards(settings, pool.health(), started))

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERRORS)
    async def get_model(model_id: str) -> ModelCard:
        """One model of the list; 404 (``model_not_found``) for any other."""
        cards = model_cards(settings, pool.health(), started)
        card = next((c for c in cards if c.id == model_id), None)
        if card is None:
            raise unknown_model(model_id, [c.id for c in cards])
        return card

    @app.post(
        "/v1/jobs",
        status_code=202,
        response_model=JobRecord,
        responses={**ERRORS, 403: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
    )
    async def submit_job(body: JobRequest) -> JobRecord:
        """Queue files or directories (inside the server's input roots) for transcription and embeddings."""
        return await asyncio.to_thread(jobs.submit, body.paths, body.vocabulary)

    @app.get("/v1/jobs/{job_id}", response_model=JobRecord, responses=ERRORS)
    async def get_job(job_id: str) -> JobRecord:
        """Status, per-input progress and the run report's summary."""
        return await asyncio.to_thread(jobs.get, job_id)

    @app.get(
        "/v1/jobs/{job_id}/result",
        response_model=JobResult,
        responses={**ERRORS, 409: {"model": ErrorResponse}},
    )
    async def get_result(
        job_id: str, embeddings: bool = Query(False, description="include the vectors")
    ) -> Response:
        """Transcripts and embeddings of a finished job (409 while it is queued or running), streamed one
        input at a time (chunked JSON: memory does not grow with the job's size)."""
        record = await asyncio.to_thread(jobs.get, job_id)
        if record.status not in FINISHED:
            raise ApiError(
                409,
                f"job {job_id} is {record.status}; its result is not ready",
                type="conflict_error",
                code="job_not_finished",
            )
        try:
            chunks = await asyncio.to_thread(job_result_chunks, record, embeddings)
            first = await asyncio.to_thread(next, chunks)  # the report is read before the answer starts
        except ArtifactError as exc:
            raise ApiError(
                500, f"the run report of job {job_id} is unreadable: {exc.reason}", code="bad_output"
            ) from exc

        def whole() -> Iterator[bytes]:
            yield first
            yield from chunks

        return StreamingResponse(whole(), media_type="application/json")

    @app.delete("/v1/jobs/{job_id}", response_model=JobRecord, responses=ERRORS)
    async def delete_job(
        job_id: str,
        delete_outputs: bool = Query(
            False, description="also delete the job's outputs and record (404 afterwards)"
        ),
    ) -> Response:
        """Cancel a queued or running job (a running job's stage children finish their current item first;
        202 until then). With ``delete_outputs=true`` its folder goes too once it has stopped."""
        record = await asyncio.to_thread(jobs.cancel, job_id, delete_outputs)
        return Response(
            record.model_dump_json(),
            status_code=200 if record.status in FINISHED else 202,
            media_type="application/json",
        )

    def admit_upload(state: dict | None = None) -> ApiError | None:
        """A transcription that could not finish within PIPELINE_TRANSCRIPTION_TIMEOUT_S is refused now.
        An admitted one counts as work ahead of the next from now on, while its upload arrives: its
        reservation (a function ending it, called once the job is queued, or by the guard when the
        request ends) is left in ``state``, and a request already holding one is not admitted twice."""
        if state is not None and state.get(UPLOAD_RESERVED) is not None:
            return None
        ahead, own = jobs.expected_wait_s(), jobs.clock.per_input_s
        retry = refusal(ahead, own, settings.transcription_timeout_s, spread=random.random())
        if retry is None:
            if state is not None:
                state[UPLOAD_RESERVED] = jobs.upload_arriving()
            return None
        return ApiError(
            429,
            f"the transcription queue would not answer within {settings.transcription_timeout_s:g}s "
            f"(about {ahead + own:.0f}s expected, {jobs.clock.per_input_s:.0f}s per input measured); "
            f"retry in {retry}s",
            type="rate_limit_error",
            code="expected_wait",
            retry_after=retry,
        )

    @app.post(
        TRANSCRIPTIONS,
        response_model=TranscriptionVerbose,
        responses={**ERRORS, 504: {"model": ErrorResponse}},
    )
    async def transcriptions(request: Request) -> Response:
        """OpenAI's audio transcription (multipart: ``file``, ``model``, ``language``, ``prompt``,
        ``response_format``, ``timestamp_granularities[]``), run as a job through the isolated stages."""
        state = request.scope.setdefault("state", {})
        refused = admit_upload(state)
        if refused is not None:
            # decided before the upload is parsed or stored; it is still read and dropped (bounded by the
            # body limit): a response sent over an unread body makes the client's TCP see a reset, not the 429
            async for _ in request.stream():
                pass
            raise refused
        try:
            form = await request.form(max_files=1, max_fields=32)
        except ApiError:
            raise  # the guard's body limit, reached while a chunked upload arrived
        except Exception as exc:  # noqa: BLE001 - python-multipart / starlette: a malformed form
            raise ApiError(
                400,
                f"the request is not a valid multipart form ({type(exc).__name__}: {exc})",
                code="invalid_form",
            ) from None
        try:
            return await _transcribe(form, request)
        finally:
            await form.close()

    async def _transcribe(form, request: Request) -> Response:
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "'file' must be an uploaded audio file", param="file", code="missing_file")
        if not form_text(form, "model"):
            raise ApiError(
                400,
                "'model' is required (any name: this server transcribes with its ASR_MODEL)",
                param="model",
                code="missing_model",
            )
        response_format = form_text(form, "response_format") or "json"
        if response_format not in TRANSCRIPTION_FORMATS:
            raise ApiError(
                400,
                f"'response_format' must be one of {', '.join(TRANSCRIPTION_FORMATS)}",
                param="response_format",
                code="invalid_response_format",
            )
        granularities = [g for g in form.getlist("timestamp_granularities[]") if isinstance(g, str)]
        if any(g not in ("word", "segment") for g in granularities):
            raise ApiError(
                400,
                "'timestamp_granularities[]' takes 'word' and 'segment'",
                param="timestamp_granularities",
                code="invalid_request",
            )
        if granularities and response_format != "verbose_json":
            raise ApiError(
                400,
                "'timestamp_granularities[]' needs response_format=verbose_json",
                param="timestamp_granularities",
                code="invalid_request",
            )
        language, prompt = form_text(form, "language"), form_text(form, "prompt")
        try:
            settings.replace(asr_language=language)
        except ValueError as exc:
            raise ApiError(
                400,
                f"'language' is not a language code: {language}",
                param="language",
                code="invalid_language",
            ) from exc
        channels = form_text(form, "channels")  # ours, beside OpenAI's fields: mix, separate or auto
        if channels is not None and channels not in CHANNEL_MODES:
            raise ApiError(
                400,
                f"'channels' must be one of {', '.join(CHANNEL_MODES)}",
                param="channels",
                code="invalid_channels",
            )
        job_id = jobs.new_id()
        folder = jobs.directory / job_id
        try:
            saved = await save_upload(upload, folder / UPLOAD_DIR, settings.max_upload_bytes)
            record = await asyncio.to_thread(
                jobs.submit_upload, folder / UPLOAD_DIR, language, prompt, channels
            )
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
        finally:  # queued now (or given up): the queue counts it, no longer the arriving uploads
            release = request.scope.get("state", {}).get(UPLOAD_RESERVED)
            if release is not None:
                release()
        shown = {
            str(saved): Path(upload.filename or "").name or "the uploaded file",
            str(folder): "the job's folder",
        }
        loop = asyncio.get_running_loop()
        finished: asyncio.Future = loop.create_future()

        def done(final: JobRecord | None) -> None:
            loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(final))

        jobs.watch(record.id, done)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            ready, _ = await asyncio.wait(
                {finished, gone},
                timeout=settings.transcription_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if finished not in ready:
                await asyncio.to_thread(jobs.cancel, record.id, True)
                if gone in ready:  # nobody reads an answer: none is made (uvicorn drops what is sent)
                    log.info("transcription %s: the client disconnected; the job was cancelled", record.id)
                    metrics.rejected.labels(reason="disconnect").inc()
                    return Response(status_code=499)
                metrics.rejected.labels(reason="deadline").inc()
                raise ApiError(
                    504,
                    f"the transcription was not done within {settings.transcription_timeout_s:g}s "
                    "(PIPELINE_TRANSCRIPTION_TIMEOUT_S); it was cancelled",
                    type="timeout_error",
                    code="deadline_exceeded",
                )
            final = finished.result()
            rules = CaptionRules.from_settings(settings)
            return await asyncio.to_thread(
                transcription_answer, final, response_format, granularities, rules, shown
            )
        finally:
            gone.cancel()
            await asyncio.to_thread(jobs.delete, record.id)

    @app.post(
        "/v1/search", response_model=SearchResponse, responses={**ERRORS, 403: {"model": ErrorResponse}}
    )
    async def search_corpus(body: SearchRequest) -> SearchResponse:
        """Segments of the server's output folders (``--search-root``) by words, meaning or both, with
        filters; each hit links to its transcript page at its moment (served under /outputs/<n>/)."""
        return await asyncio.to_thread(run_search, settings, pool, body)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def search_home() -> HTMLResponse:
        """The search page: a box over the search roots' catalogues, and links to their index pages."""
        return HTMLResponse(search_page(settings))

    for n, root in enumerate(settings.search_roots):  # each root's files: the pages a hit links to
        app.mount(f"/outputs/{n}", StaticFiles(directory=str(root), check_dir=False), name=f"outputs-{n}")

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

    app.add_middleware(
        Guard, settings=settings, metrics=metrics, admit_upload=admit_upload, drain_s=pool.drain_s
    )
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

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
        loop=settings.api_loop,
        http=settings.api_http,
        timeout_keep_alive=settings.keep_alive_s,
        **extra,
    )


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


def start_in_thread(
    settings: Settings, pool: EmbeddingPool | None = None, timeout_s: float = 30.0
) -> RunningServer:
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
