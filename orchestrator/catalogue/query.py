"""A search query's vector: embedded by the run's embeddings model, as a query, in a spawned worker child.

The parent never imports torch: the query goes to the same worker the API's pool starts
(``stages.workers.embeddings`` through :class:`~orchestrator.process.worker.WorkerProcess`), with
``input_type="query"`` (the model's query prompt, for models that have one). The model is the one the
settings' embeddings profile loads now (after any offline fallback), named as artifacts name it, so a search
compares the query only with vectors of that very model.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from contracts.models import portable_name
from contracts.worker import Embedded, EmbedTask, WorkerConfig
from orchestrator.process.worker import WorkerDied, WorkerProcess

log = logging.getLogger(__name__)

#: seconds a query worker may take to load its model
START_TIMEOUT_S = 600.0
#: seconds one query may take to embed
QUERY_TIMEOUT_S = 120.0


class QueryError(Exception):
    """The query could not be embedded (the worker did not start, or failed on it)."""


@dataclass(frozen=True)
class QueryVector:
    #: unit norm, float32
    vector: np.ndarray
    #: the model that made it, as artifacts name it
    model: str


def embed_query(settings, text: str, log_dir: Path) -> QueryVector:
    """``text``'s vector from a worker child of the settings' embeddings profile (its log under
    ``log_dir``)."""
    config = WorkerConfig(
        name="search",
        profile=settings.embedding_profile,
        device=settings.device,
        allow_hub=settings.hub,
        fallback=settings.embedding_fallback,
        env=settings.child_env(),
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    worker = WorkerProcess(config, log_dir / f"search-{stamp}-{os.getpid()}.log")
    try:
        ready = worker.wait_ready(START_TIMEOUT_S)
        reply = worker.call(EmbedTask(task_id=0, texts=[text], input_types=["query"]), QUERY_TIMEOUT_S)
    except WorkerDied as exc:
        raise QueryError(f"the query could not be embedded: {exc}") from None
    finally:
        worker.stop()
    if not isinstance(reply, Embedded):
        raise QueryError(f"the query could not be embedded: {reply.message}")
    vector = np.frombuffer(reply.vectors, dtype="<f4").reshape(reply.count, reply.dimension)[0]
    model = portable_name(ready.model_path or ready.model)
    log.info("query embedded by %s in %.2f s (model loaded in %.1f s)", model, reply.seconds, ready.load_s)
    return QueryVector(vector.astype(np.float32), model)
