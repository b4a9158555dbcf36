"""Messages between the API server (parent) and an embedding worker child.

They travel as plain dicts over a ``multiprocess`` pipe and are validated on
both ends with :data:`TO_WORKER` / :data:`FROM_WORKER`. Vectors travel as raw
little-endian float32 bytes (one row per text), not as lists of floats.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, TypeAdapter

from contracts.artifacts import Strict


class WorkerConfig(Strict):
    """What a worker child is started with."""

    #: name used in logs, e.g. "embed-speed"
    name: str = Field(min_length=1)
    #: "speed", "quality", "embedded" or a model name (stages.embeddings.resolve_model)
    profile: str
    #: the module whose ``load_embedder(config)`` builds the encoder (tests swap in fixtures)
    module: str = Field("stages.workers.embeddings", pattern=r"^[A-Za-z_][\w.]*$")
    device: str = "auto"
    allow_hub: bool = False
    fallback: bool = True
    #: environment applied before any heavy import (HF_HUB_OFFLINE, PYTORCH_CUDA_ALLOC_CONF, ...)
    env: dict[str, str] = Field(default_factory=dict)
    #: module-specific options
    options: dict[str, JsonValue] = Field(default_factory=dict)


class EmbedTask(Strict):
    """Encode ``texts`` (one micro-batch) in one ``encode`` call of ``len(texts)``."""

    kind: Literal["embed"] = "embed"
    task_id: int = Field(ge=0)
    texts: list[str] = Field(min_length=1)
    normalize: bool = True
    #: each text's ``input_type`` ("query", "document"; None: the model's default), or None for all None
    input_types: list[Literal["query", "document"] | None] | None = None


class StopWorker(Strict):
    kind: Literal["stop"] = "stop"


class Ready(Strict):
    kind: Literal["ready"] = "ready"
    pid: int
    #: the model actually loaded (after any fallback), by name: a hub id, never a server path
    model: str
    #: where it was loaded from (for the server's log only)
    model_path: str | None = None
    requested_model: str
    fallback_reason: str | None = None
    device: str
    dimension: int = Field(gt=0)
    max_seq_length: int | None = None
    load_s: float = Field(ge=0)
    #: whether ``input_type`` changes what the model sees (its query and document prompts differ)
    applies_input_types: bool = False


class Embedded(Strict):
    kind: Literal["embedded"] = "embedded"
    task_id: int
    #: ``count x dimension`` little-endian float32
    vectors: bytes
    count: int = Field(ge=1)
    dimension: int = Field(gt=0)
    #: tokens per text as the model saw them (its prompt and special tokens included, after truncation)
    tokens: list[int]
    seconds: float = Field(ge=0)


class TaskFailed(Strict):
    """The task did not complete; the worker is still alive and takes the next one."""

    kind: Literal["failed"] = "failed"
    task_id: int
    #: "oom": out of memory (the parent halves the micro-batch); "error": anything else
    reason: Literal["oom", "error"]
    message: str


class StartFailed(Strict):
    """The model could not be loaded; the worker exits after sending this."""

    kind: Literal["start_failed"] = "start_failed"
    reason: Literal["oom", "unavailable", "error"]
    message: str


ToWorker = Annotated[EmbedTask | StopWorker, Field(discriminator="kind")]
FromWorker = Annotated[Ready | Embedded | TaskFailed | StartFailed, Field(discriminator="kind")]

TO_WORKER: TypeAdapter[EmbedTask | StopWorker] = TypeAdapter(ToWorker)
FROM_WORKER: TypeAdapter[Ready | Embedded | TaskFailed | StartFailed] = TypeAdapter(FromWorker)
