"""Embedding workers of the API server: one spawned child per profile, fed dynamic micro-batches.

For each profile a :class:`ProfileWorker` owns one batching thread and at most
one worker process (``stages.embedding_worker`` in a ``multiprocess`` spawn
child, like every stage). Requests put their texts in the profile's queue;
the thread takes texts from the queue in arrival order until the micro-batch
holds ``embed_max_batch`` texts or the oldest text has waited
``embed_max_wait_ms``, sends the micro-batch to the worker over a pipe, and
hands each request its rows. A request larger than the cap spans several
micro-batches; texts of many small concurrent requests share one.

The worker starts on first use, stays warm, is replaced after
``worker_recycle_after`` micro-batches and stopped after ``worker_idle_s``
without work (the process exits: its memory and CUDA context go back). What
follows a failure is decided by the one retry policy,
:func:`orchestrator.run.outcome.next_step`: out of memory halves the micro-batch
(down to 1) and retries the same texts; a worker killed by a signal is
replaced and its texts retried once, then their requests fail with 503.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from multiprocess.connection import wait as wait_for

from contracts.api import WorkerHealth
from contracts.errors import ApiError
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
from orchestrator.process.toolkit import CONTEXT, FileFollower, LogRelay, spawn, stop
from orchestrator.api.metrics import Metrics
from orchestrator.run.outcome import OOM_ADVICE, Outcome, next_step, outcome_of
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

WORKER_MODULE = "stages.embedding_worker"
#: a text is retried on a fresh worker this many times after its worker was killed
MAX_CRASH_RETRIES = 1


class WorkerDied(Exception):
    """The worker process ended while the server waited for it."""

    def __init__(self, exitcode: int | None, message: str | None = None) -> None:
        self.exitcode = exitcode
        self.message = message
        super().__init__(message or f"worker exited with {exitcode}")


class _Process:
    """One worker child and its end of the pipe."""

    def __init__(self, config: WorkerConfig, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        parent_conn, child_conn = CONTEXT.Pipe(duplex=True)
        self.conn = parent_conn
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        self.follow = FileFollower(log_path, LogRelay(config.name))
        # the server never imports the worker's model code: the child does
        self.proc = spawn(f"{WORKER_MODULE}:main", (child_conn, config.model_dump_json(), str(log_path)),
                          name=config.name)
        child_conn.close()
        self.follow.start()
        self.ready: Ready | None = None
        self.batches = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> Ready:
        message = self._receive(timeout)
        if isinstance(message, StartFailed):
            self.proc.join(30)
            raise WorkerDied(self.proc.exitcode, message.message)
        if not isinstance(message, Ready):
            raise WorkerDied(None, f"expected Ready, got {type(message).__name__}")
        self.ready = message
        return message

    def call(self, task: EmbedTask) -> Embedded | TaskFailed:
        self.conn.send(TO_WORKER.dump_python(task))
        reply = self._receive(None)
        if not isinstance(reply, (Embedded, TaskFailed)) or reply.task_id != task.task_id:
            raise WorkerDied(None, f"unexpected reply {type(reply).__name__} to task {task.task_id}")
        return reply

    def _receive(self, timeout: float | None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait_for([self.conn, self.proc.sentinel], timeout=left)
            if self.conn in ready:
                try:
                    return FROM_WORKER.validate_python(self.conn.recv())
                except (EOFError, OSError):
                    pass  # died mid-message: fall through to the exit status
            if self.conn in ready or self.proc.sentinel in ready:
                self.proc.join(5)
                raise WorkerDied(self.proc.exitcode)
            if deadline is not None and time.monotonic() >= deadline:
                self.stop(grace_s=0)
                raise WorkerDied(self.proc.exitcode, f"model not loaded within {timeout:.0f}s")

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.exitcode is None and grace_s > 0:
            try:
                self.conn.send(TO_WORKER.dump_python(StopWorker()))
            except (OSError, ValueError):
                pass
            self.proc.join(grace_s)
        stop(self.proc, grace_s=2.0)
        self.conn.close()
        self.follow.stop()


class _Request:
    """One HTTP request's texts; resolved when every text has its row."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.arrived = time.monotonic()
        self.future: concurrent.futures.Future[EmbedResult] = concurrent.futures.Future()
        self.vectors: np.ndarray | None = None
        self.tokens = [0] * len(texts)
        self.left = len(texts)
        self.model: str | None = None
        self.done = False

    def fill(self, start: int, rows: np.ndarray, tokens: list[int], model: str) -> None:
        if self.done:
            return
        if self.vectors is None:
            self.vectors = np.empty((len(self.texts), rows.shape[1]), dtype=np.float32)
        self.vectors[start:start + len(rows)] = rows
        self.tokens[start:start + len(rows)] = tokens
        self.model = model
        self.left -= len(rows)
        if self.left == 0:
            self.done = True
            self.future.set_result(EmbedResult(self.vectors, self.tokens, model))

    def fail(self, error: Exception) -> None:
        if not self.done:
            self.done = True
            self.future.set_exception(error)


@dataclass
class _Part:
    """A run of consecutive texts of one request."""

    request: _Request
    start: int
    count: int
    #: worker deaths this part has been through
    crashes: int = 0

    def texts(self) -> list[str]:
        return self.request.texts[self.start:self.start + self.count]


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray
    tokens: list[int]
    #: the model actually used
    model: str


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"


class ProfileWorker:
    """The queue, batching thread and worker process of one profile."""

    def __init__(self, profile: str, settings: Settings, metrics: Metrics, module: str = WORKER_MODULE,
                 options: dict | None = None) -> None:
        self.profile = profile
        self.settings = settings
        self.metrics = metrics
        self.name = f"embed-{_safe(profile)}"
        self.config = WorkerConfig(name=self.name, profile=profile, module=module, device=settings.device,
                                   allow_hub=settings.hub, fallback=settings.embedding_fallback,
                                   env=settings.child_env(), options=options or {})
        self.cap = settings.embed_max_batch
        self._queue: deque[_Part] = deque()
        self._queued_texts = 0
        self._cond = threading.Condition()
        self._closing = False
        self._worker: _Process | None = None
        self._last_active = time.monotonic()
        self._task_ids = itertools.count()
        self._starts = 0
        # Children get PR_SET_PDEATHSIG from the thread that spawns them, so this thread, which starts
        # every worker of the profile, lives as long as the server.
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    # -- called by request handlers ------------------------------------------
    def submit(self, texts: list[str]) -> concurrent.futures.Future[EmbedResult]:
        request = _Request(texts)
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            self._queue.append(_Part(request, 0, len(texts)))
            self._queued_texts += len(texts)
            self._cond.notify()
        return request.future

    def health(self) -> WorkerHealth:
        worker = self._worker
        ready = worker.ready if worker is not None else None
        return WorkerHealth(profile=self.profile, running=ready is not None, pid=worker.pid if ready else None,
                            model=ready.model if ready else None, fallback_reason=ready.fallback_reason if ready else None,
                            device=ready.device if ready else None, batches=worker.batches if worker else 0,
                            max_batch=self.cap)

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    @property
    def pid(self) -> int | None:
        worker = self._worker
        return worker.pid if worker is not None and worker.ready is not None else None

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    # -- the batching thread ----------------------------------------------------
    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                break
            if not batch:  # idle for too long
                self._stop_worker("idle")
                continue
            try:
                self._run(batch)
            except Exception as exc:  # noqa: BLE001 - never leave a request hanging
                log.exception("%s: micro-batch failed unexpectedly", self.name)
                for part in batch:
                    part.request.fail(ApiError(500, f"internal error ({type(exc).__name__})", code="internal_error"))
        self._stop_worker("shutdown")
        with self._cond:
            leftover, self._queue = list(self._queue), deque()
            self._queued_texts = 0
        for part in leftover:
            part.request.fail(ApiError(503, "the server is shutting down", code="shutting_down"))

    def _take(self) -> list[_Part] | None:
        """The next micro-batch; [] when the worker has been idle too long; None when closing."""
        with self._cond:
            while not self._queue and not self._closing:
                if self._worker is None:
                    self._cond.wait()
                    continue
                left = self._last_active + self.settings.worker_idle_s - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            if self._closing:
                return None
            deadline = self._queue[0].request.arrived + self.settings.embed_max_wait_ms / 1000
            while self._queued_texts < self.cap and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, size = [], 0
            while self._queue and size < self.cap:
                part = self._queue.popleft()
                room = self.cap - size
                if part.count > room:  # split: the rest stays first in line
                    self._queue.appendleft(_Part(part.request, part.start + room, part.count - room, part.crashes))
                    part = _Part(part.request, part.start, room, part.crashes)
                batch.append(part)
                size += part.count
            self._queued_texts -= size
            self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)
            return batch

    def _requeue(self, parts: list[_Part]) -> None:
        with self._cond:
            self._queue.extendleft(reversed(parts))
            self._queued_texts += sum(p.count for p in parts)
            self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)

    def _run(self, batch: list[_Part]) -> None:
        live = [p for p in batch if not p.request.done]
        if not live:
            return
        try:
            worker = self._ensure_worker()
        except WorkerDied as exc:
            self._fail_start(live, exc)
            return
        texts = [t for part in live for t in part.texts()]
        task = EmbedTask(task_id=next(self._task_ids), texts=texts)
        try:
            reply = worker.call(task)
        except WorkerDied as exc:
            self._crashed(live, exc)
            return
        self._last_active = time.monotonic()
        if isinstance(reply, Embedded):
            self._deliver(live, reply, worker)
        elif reply.reason == "oom":
            decision = next_step(Outcome.OOM, len(texts), 0, 0, stage=self.name)
            log.warning("%s: %s", self.name, decision.reason)
            if decision.retry:
                self.cap = min(self.cap, decision.batch_size)
                self.metrics.oom_retries.labels(profile=self.profile).inc()
                self._requeue(live)
            else:
                self._fail(live, ApiError(503, decision.reason, code="out_of_memory"))
        else:
            self._fail(live, ApiError(500, f"the embedding worker failed on this batch: {reply.message}",
                                      code="worker_error"))

    def _deliver(self, parts: list[_Part], reply: Embedded, worker: _Process) -> None:
        rows = np.frombuffer(reply.vectors, dtype="<f4").reshape(reply.count, reply.dimension)
        model = worker.ready.model if worker.ready else self.profile
        worker.batches += 1
        recycle = bool(self.settings.worker_recycle_after) and worker.batches >= self.settings.worker_recycle_after
        if recycle:  # detached before the answers go out: whoever sees them sees the worker gone
            self._worker = None
        self.metrics.batch_size.labels(profile=self.profile).observe(reply.count)
        self.metrics.texts.labels(profile=self.profile).inc(reply.count)
        self.metrics.batch_seconds.labels(profile=self.profile).inc(reply.seconds)
        offset = 0
        for part in parts:
            part.request.fill(part.start, rows[offset:offset + part.count], reply.tokens[offset:offset + part.count], model)
            offset += part.count
        if recycle:
            log.info("%s: recycling worker pid %s after %d micro-batches", self.name, worker.pid, worker.batches)
            self.metrics.worker_restarts.labels(profile=self.profile, reason="recycle").inc()
            self._stop_process(worker, "recycle")

    def _crashed(self, parts: list[_Part], exc: WorkerDied) -> None:
        outcome, sig = outcome_of(exc.exitcode) if exc.exitcode is not None else (Outcome.KILLED, None)
        pid = self._worker.pid if self._worker else None
        log.error("%s: worker pid %s died mid-batch (%s%s)", self.name, pid, outcome.value,
                  f", signal {sig}" if sig else "")
        self._discard_worker()
        self.metrics.worker_restarts.labels(profile=self.profile, reason="crash").inc()
        retry = []
        for part in parts:
            decision = next_step(outcome, part.count, part.crashes, MAX_CRASH_RETRIES, signal=sig, stage=self.name)
            if decision.retry:
                part.crashes += 1
                if outcome is Outcome.OOM:
                    self.cap = min(self.cap, decision.batch_size)
                retry.append(part)
            else:
                part.request.fail(ApiError(503, f"the embedding worker crashed: {decision.reason}",
                                           code="worker_crashed"))
        if retry:
            self.metrics.crash_retries.labels(profile=self.profile).inc(sum(p.count for p in retry))
            self._requeue(retry)

    def _fail_start(self, parts: list[_Part], exc: WorkerDied) -> None:
        """The model could not be loaded: this batch and everything queued fail alike."""
        with self._cond:
            parts = parts + list(self._queue)
            self._queue.clear()
            self._queued_texts = 0
        outcome = outcome_of(exc.exitcode)[0] if exc.exitcode is not None else Outcome.ERROR
        reason = exc.message or f"worker exited ({outcome.value})"
        if outcome is Outcome.OOM:
            reason += f": {OOM_ADVICE}"
        self._fail(parts, ApiError(503, f"embedding model for {self.profile!r} is unavailable: {reason}",
                                   code="model_unavailable"))

    def _fail(self, parts: list[_Part], error: ApiError) -> None:
        for part in parts:
            part.request.fail(error)

    def _ensure_worker(self) -> _Process:
        if self._worker is not None:
            return self._worker
        self._starts += 1
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        log_path = Path(self.settings.server_dir) / "workers" / f"{self.name}-{stamp}-{os.getpid()}-{self._starts}.log"
        worker = _Process(self.config, log_path)
        self.metrics.worker_starts.labels(profile=self.profile).inc()
        log.info("%s: starting worker pid %s (log %s)", self.name, worker.pid, log_path)
        try:
            ready = worker.wait_ready(self.settings.worker_start_timeout_s)
        except WorkerDied:
            worker.stop(grace_s=0)
            raise
        self._worker = worker
        self._last_active = time.monotonic()
        self.metrics.workers_up.labels(profile=self.profile).set(1)
        log.info("%s: worker pid %d ready: %s (%s) on %s", self.name, ready.pid, ready.model, ready.model_path,
                 ready.device)
        return worker

    def _discard_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(grace_s=0)
        self.metrics.workers_up.labels(profile=self.profile).set(0)

    def _stop_worker(self, reason: str) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            self._stop_process(worker, reason)

    def _stop_process(self, worker: _Process, reason: str) -> None:
        log.info("%s: stopping worker pid %s (%s)", self.name, worker.pid, reason)
        worker.stop()
        self.cap = self.settings.embed_max_batch  # a fresh worker starts from the configured cap again
        self.metrics.worker_stops.labels(profile=self.profile, reason=reason).inc()
        self.metrics.workers_up.labels(profile=self.profile).set(0)


class EmbeddingPool:
    """The profiles' workers, created on first use."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None, module: str = WORKER_MODULE,
                 options: dict | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.module = module
        self.options = options
        self._workers: dict[str, ProfileWorker] = {}
        self._lock = threading.Lock()
        self._closed = False

    def worker(self, profile: str) -> ProfileWorker:
        with self._lock:
            if self._closed:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if profile not in self._workers:
                self._workers[profile] = ProfileWorker(profile, self.settings, self.metrics, self.module, self.options)
            return self._workers[profile]

    def embed(self, profile: str, texts: list[str]) -> concurrent.futures.Future[EmbedResult]:
        return self.worker(profile).submit(texts)

    def workers(self) -> list[ProfileWorker]:
        with self._lock:
            return list(self._workers.values())

    def health(self) -> list[WorkerHealth]:
        return [w.health() for w in self.workers()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
        for worker in workers:
            worker.close()
