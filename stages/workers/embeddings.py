"""The API's embedding worker: a long-lived child that keeps one model loaded and encodes micro-batches.

Started by ``orchestrator.process.worker`` through ``multiprocess``'s spawn context,
one per profile. It talks to the server over a pipe (messages of
``contracts.worker``, validated on both ends): ``Ready`` once the model is
loaded, then one ``Embedded`` or ``TaskFailed`` per ``EmbedTask``. Out of
memory inside a task is reported (the parent halves the micro-batch, with the
one retry policy ``orchestrator.run.outcome.next_step``) and the worker goes on;
when it is stopped, or idle for too long, the process exits and the driver
takes back its whole CUDA context.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from importlib import import_module
from pathlib import Path

from contracts import ExitCode
from contracts.api import EMBEDDED_MODEL_NAMES
from contracts.errors import ModelUnavailableError
from contracts.worker import (
    FROM_WORKER,
    TO_WORKER,
    Embedded,
    EmbedTask,
    Ready,
    StartFailed,
    StopWorker,
    TaskFailed,
    WorkerConfig,
)
from stages.runtime.child import bootstrap, leave
from stages.runtime.memory import is_oom

log = logging.getLogger(__name__)


class Embedder:
    """A loaded sentence-transformers model: encode, count tokens, describe itself."""

    def __init__(self, config: WorkerConfig) -> None:
        import torch

        from stages.embeddings import STAGE, load_model

        self.torch = torch
        self.device = STAGE.resolve_device(config.device)  # "auto": CUDA when this child sees a GPU
        started = time.perf_counter()
        loaded = load_model(config.profile, self.device, allow_hub=config.allow_hub, fallback=config.fallback)
        self.load_s = time.perf_counter() - started
        self.model = loaded.model
        self.loaded = loaded
        self.dimension = int(self.model.get_embedding_dimension())

    def ready(self) -> Ready:
        from stages.embeddings import applies_input_types

        return Ready(
            pid=os.getpid(),
            model=public_name(self.loaded.name),
            model_path=self.loaded.name,
            requested_model=public_name(self.loaded.requested),
            fallback_reason=self.loaded.fallback_reason,
            device=self.device,
            dimension=self.dimension,
            max_seq_length=getattr(self.model, "max_seq_length", None),
            load_s=self.load_s,
            applies_input_types=applies_input_types(self.model, self.loaded.name),
        )

    def encode(self, texts: list[str], normalize: bool, input_types: list[str | None] | None = None):
        """``len(texts) x dimension`` float32, in one batch of ``len(texts)``; each text with the prompt of its
        ``input_types`` entry (stages.embeddings.prompt_for)."""
        import numpy as np

        from stages.embeddings import encode_typed

        vectors = encode_typed(
            self.model,
            self.loaded.name,
            texts,
            input_types,
            batch_size=len(texts),
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype="<f4")

    def count_tokens(self, texts: list[str], input_types: list[str | None] | None = None) -> list[int]:
        """Tokens per text as the model sees them: behind the prompt of its ``input_types`` entry, special
        tokens included, truncated to its max length."""
        from stages.embeddings import encoded_texts

        texts = encoded_texts(self.model, self.loaded.name, texts, input_types)
        tokenizer = getattr(self.model, "tokenizer", None)
        if tokenizer is None:
            return [len(text.split()) for text in texts]
        limit = getattr(self.model, "max_seq_length", None)
        encoded = tokenizer(texts, truncation=limit is not None, max_length=limit, add_special_tokens=True)
        return [len(ids) for ids in encoded["input_ids"]]

    def release(self) -> None:
        """After an out-of-memory: drop what the failed batch left behind."""
        gc.collect()
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


def public_name(model: str) -> str:
    """What answers call ``model``: the hub id, or for a local directory a name that tells no server path."""
    for directory, name in EMBEDDED_MODEL_NAMES.items():
        if model.rstrip("/").endswith(directory):
            return name
    path = Path(model)
    return path.name if path.is_absolute() else model


def load_embedder(config: WorkerConfig) -> Embedder:
    return Embedder(config)


def serve(conn, config: WorkerConfig) -> ExitCode:
    """Load the model, say ``Ready``, then answer tasks until told to stop (or the pipe closes)."""
    try:
        embedder = import_module(config.module).load_embedder(config)
    except BaseException as exc:  # every way out is reported, then becomes an exit code
        reason = (
            "oom" if is_oom(exc) else "unavailable" if isinstance(exc, ModelUnavailableError) else "error"
        )
        message = " ".join(str(exc).split())[:500] or type(exc).__name__
        log.error("%s: cannot load the model: %s", config.name, message, exc_info=reason == "error")
        _send(conn, StartFailed(reason=reason, message=message))
        return ExitCode.OOM if reason == "oom" else ExitCode.FAILED
    ready = embedder.ready()
    log.info(
        "%s: pid %d, %s on %s (dimension %d), loaded in %.2fs%s",
        config.name,
        ready.pid,
        ready.model,
        ready.device,
        ready.dimension,
        ready.load_s,
        f"; fallback: {ready.fallback_reason}" if ready.fallback_reason else "",
    )
    _send(conn, ready)
    while True:
        try:
            message = TO_WORKER.validate_python(conn.recv())
        except EOFError:
            log.info("%s: the server closed the pipe; exiting", config.name)
            return ExitCode.OK
        if isinstance(message, StopWorker):
            log.info("%s: stopping as asked", config.name)
            return ExitCode.OK
        _send(conn, _run(embedder, message, config.name))


def _run(embedder: Embedder, task: EmbedTask, name: str) -> Embedded | TaskFailed:
    started = time.perf_counter()
    try:
        typed = () if task.input_types is None else (task.input_types,)  # test encoders take two arguments
        vectors = embedder.encode(task.texts, task.normalize, *typed)
        tokens = embedder.count_tokens(task.texts, *typed)
    except Exception as exc:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        if is_oom(exc):
            log.error("%s: out of memory on a micro-batch of %d: %s", name, len(task.texts), message)
            del exc
            embedder.release()
            return TaskFailed(task_id=task.task_id, reason="oom", message=message)
        log.exception("%s: micro-batch of %d failed", name, len(task.texts))
        return TaskFailed(task_id=task.task_id, reason="error", message=message)
    seconds = time.perf_counter() - started
    log.debug("%s: %d text(s) in %.3fs", name, len(task.texts), seconds)
    return Embedded(
        task_id=task.task_id,
        vectors=vectors.tobytes(),
        count=int(vectors.shape[0]),
        dimension=int(vectors.shape[1]),
        tokens=tokens,
        seconds=seconds,
    )


def _send(conn, message) -> None:
    conn.send(FROM_WORKER.dump_python(message))


def main(conn, config_json: str, log_path: str | None = None) -> None:
    """Entry of the worker child (called by ``orchestrator.process.worker`` in the spawned process)."""
    bootstrap(log_path)  # the server owns Ctrl-C; output to the worker's log
    config = WorkerConfig.model_validate_json(config_json)
    os.environ.update(config.env)
    leave(serve(conn, config))
