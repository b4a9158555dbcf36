"""Embedding workers of the API server: one spawned child per profile, fed dynamic micro-batches.

For each profile a :class:`ProfileWorker` owns one batching thread and at most
one worker process (``stages.workers.embeddings`` in a ``multiprocess`` spawn
child, like every stage). Requests put their texts in the profile's queue
(bounded: ``embed_max_queued_texts``, 429 beyond); the thread waits until the
queue holds ``embed_max_batch`` texts or the oldest text has waited
``embed_max_wait_ms``, then builds a micro-batch around the oldest text from
the texts of similar length near the head of the queue, up to
``embed_max_batch`` texts and ``embed_max_batch_tokens`` padded tokens, sends
it to the worker over a pipe, and hands each request its rows. Token counts
are estimated in the parent from the text's length and a characters-per-token
ratio learnt from the worker's exact counts (the parent never loads a
tokenizer). A request whose client went away or whose deadline passed is
cancelled: its queued texts are dropped before a worker sees them.

The worker starts on first use, stays warm, is replaced after
``worker_recycle_after`` micro-batches and stopped after ``worker_idle_s``
without work (the process exits: its memory and CUDA context go back). What
follows a failure is decided by the one retry policy,
:func:`orchestrator.run.outcome.next_step`: out of memory halves the micro-batch
(down to 1) and retries the same texts; a worker killed by a signal is
replaced and its texts retried once, then their requests fail with 503. A
micro-batch not done within ``embed_batch_timeout_s`` kills and replaces the
worker the same way; its texts are retried one request at a time, so the text
that hangs fails alone. Any other failure of a micro-batch is bisected until
the failing texts are found: only their requests fail (400 when other texts
encode, 500 when nothing does, which is a fault of the server).

The child process itself is wrapped by :mod:`orchestrator.process.worker`; how the queue's head is
cut into micro-batches, how tokens are estimated and what a micro-batch costs is the pure policy of
:mod:`orchestrator.api.batching`. This module holds the requests, the queue, the thread and what
follows a failure.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from contracts.api import WorkerHealth
from contracts.errors import ApiError
from contracts.models import portable_name
from contracts.worker import Embedded, EmbedTask, TaskFailed, WorkerConfig
from orchestrator.api.admission import Lateness, Throughput, refusal, work_ahead
from orchestrator.api.batching import (
    WINDOW_TEXTS,
    BatchCost,
    estimate_tokens,
    head_batch,
    learn_chars_per_token,
)
from orchestrator.api.metrics import Metrics
from orchestrator.process.outcome import Outcome, outcome_of
from orchestrator.process.worker import WORKER_MODULE, WorkerDied, WorkerProcess
from orchestrator.run.outcome import OOM_ADVICE, next_step
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: a text is retried on a fresh worker this many times after its worker was killed
MAX_CRASH_RETRIES = 1


class _Request:
    """One HTTP request's texts; resolved when every text has its row."""

    def __init__(self, texts: list[str], input_type: str | None = None) -> None:
        self.texts = texts
        #: "query", "document" or None (the model's default prompt)
        self.input_type = input_type
        self.arrived = time.monotonic()
        self.lengths = [len(t) for t in texts]
        self.future: concurrent.futures.Future[EmbedResult] = concurrent.futures.Future()
        self.vectors: np.ndarray | None = None
        self.tokens = [0] * len(texts)
        self.left = len(texts)
        self.model: str | None = None
        self.done = False
        #: seconds the queue expected it to take at admission (uncalibrated; 0 before any measurement)
        self.estimate = 0.0

    def fill(
        self,
        start: int,
        rows: np.ndarray,
        tokens: list[int],
        model: str,
        typed: bool = False,
        source: str | None = None,
    ) -> None:
        if self.done:
            return
        if self.vectors is None:
            self.vectors = np.empty((len(self.texts), rows.shape[1]), dtype=np.float32)
        self.vectors[start : start + len(rows)] = rows
        self.tokens[start : start + len(rows)] = tokens
        self.model = model
        self.left -= len(rows)
        if self.left == 0:
            self.done = True
            try:
                self.future.set_result(EmbedResult(self.vectors, self.tokens, model, typed, source or model))
            except concurrent.futures.InvalidStateError:
                pass  # cancelled by its waiter meanwhile

    def fail(self, error: Exception) -> None:
        if not self.done:
            self.done = True
            try:
                self.future.set_exception(error)
            except concurrent.futures.InvalidStateError:
                pass


class Ticket:
    """What a request handler holds: the future of its rows, and a way to give up on them."""

    def __init__(self, worker: ProfileWorker, request: _Request) -> None:
        self.worker = worker
        self.request = request
        self.future = request.future

    def cancel(self, reason: str) -> int:
        """Fail the request and drop its queued texts; how many were dropped."""
        return self.worker.cancel(self.request, reason)


@dataclass
class _Part:
    """A run of consecutive texts of one request."""

    request: _Request
    start: int
    count: int
    #: worker deaths this part has been through
    crashes: int = 0
    #: run in a micro-batch of its own request only (after a time-out, so a hanging text fails alone)
    solo: bool = False

    @property
    def chars(self) -> int:
        return max(self.request.lengths[self.start : self.start + self.count], default=0)

    def texts(self) -> list[str]:
        return self.request.texts[self.start : self.start + self.count]


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray
    tokens: list[int]
    #: the model actually used
    model: str
    #: whether ``input_type`` changed what that model saw (its query and document prompts differ)
    input_type_applied: bool = False
    #: that model as artifacts name it (``contracts.models.portable_name``): what the catalogue's vectors
    #: record, so a search compares a query only with vectors of the very same model
    source_model: str | None = None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"


class ProfileWorker:
    """The queue, batching thread and worker process of one profile."""

    def __init__(
        self,
        profile: str,
        settings: Settings,
        metrics: Metrics,
        module: str = WORKER_MODULE,
        options: dict | None = None,
    ) -> None:
        self.profile = profile
        self.settings = settings
        self.metrics = metrics
        self.name = f"embed-{_safe(profile)}"
        self.config = WorkerConfig(
            name=self.name,
            profile=profile,
            module=module,
            device=settings.device,
            allow_hub=settings.hub,
            fallback=settings.embedding_fallback,
            env=settings.child_env(),
            options=options or {},
        )
        self.cap = settings.embed_max_batch
        #: characters per token of this profile's model, learnt from the worker's exact counts
        self.chars_per_token = 4.0
        self.max_tokens: int | None = None
        #: a micro-batch's cost, learnt from the worker's answers: decides how long texts are grouped
        self.cost = BatchCost()
        #: tokens per second and per text, learnt from the worker's answers: admission by expected wait
        self.throughput = Throughput()
        #: answered requests' time over their estimate: the server's own time, which the estimate leaves out
        self.lateness = Lateness()
        self._last_done, self._backlog = 0.0, False
        self._queue: deque[_Part] = deque()
        self._queued_texts = 0
        #: a micro-batch is with the worker
        self._busy = False
        self._cond = threading.Condition()
        self._closing = False
        self._worker: WorkerProcess | None = None
        self._last_active = time.monotonic()
        self._task_ids = itertools.count()
        self._starts = 0
        # Children get PR_SET_PDEATHSIG from the thread that spawns them, so this thread, which starts
        # every worker of the profile, lives as long as the server.
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    # -- called by request handlers ------------------------------------------
    def submit(
        self, texts: list[str], input_type: str | None = None
    ) -> concurrent.futures.Future[EmbedResult]:
        return self.ticket(texts, input_type=input_type).future

    def ticket(self, texts: list[str], waited_s: float = 0.0, input_type: str | None = None) -> Ticket:
        """Queue ``texts`` (one unit per text, so micro-batches can group them by length); 429 when the
        queue holds ``embed_max_queued_texts`` already (a request larger than that still enters an empty queue)
        or when it is not expected to finish within the deadline behind the work queued or in flight
        (lengthened by ``waited_s``, the event loop's lag). With nothing queued or in flight, any request is
        admitted; a refused one leaves nothing behind."""
        request = _Request(texts, input_type)
        bound = self.settings.embed_max_queued_texts
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if self._queued_texts and self._queued_texts + len(texts) > bound:
                self.metrics.rejected.labels(reason="queue").inc()
                raise ApiError(
                    429,
                    f"the {self.profile!r} queue is full ({self._queued_texts} texts waiting, "
                    f"at most {bound}); retry later",
                    type="rate_limit_error",
                    code="queue_full",
                )
            queue_s = self.throughput.queue_seconds(self._queued_texts, self._busy)
            own = self.throughput.seconds(sum(self.tokens(n) for n in request.lengths))
            late = self.lateness.factor
            ahead = work_ahead(queue_s * late, waited_s)
            retry = refusal(ahead, own * late, self.settings.request_timeout_s, spread=random.random())
            if retry is not None:
                self.metrics.rejected.labels(reason="expected_wait").inc()
                raise ApiError(
                    429,
                    f"the {self.profile!r} queue would not answer within the request deadline of "
                    f"{self.settings.request_timeout_s:g}s (about {ahead:.0f}s of work ahead and {own * late:.0f}s "
                    f"of its own at the measured {self.throughput.tokens_per_s:.0f} tokens/s); retry in {retry}s",
                    type="rate_limit_error",
                    code="expected_wait",
                    retry_after=retry,
                )
            request.estimate = queue_s + own
            self._queue.extend(_Part(request, i, 1) for i in range(len(texts)))
            self._queued_texts += len(texts)
            self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)
            self._cond.notify()
        return Ticket(self, request)

    def cancel(self, request: _Request, reason: str) -> int:
        with self._cond:
            if request.done:
                return 0
            request.fail(ApiError(499, reason, code="cancelled"))
            kept = deque(p for p in self._queue if p.request is not request)
            dropped = self._queued_texts - sum(p.count for p in kept)
            self._queue, self._queued_texts = kept, self._queued_texts - dropped
            self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)
        if dropped:
            self.metrics.dropped_texts.labels(profile=self.profile).inc(dropped)
            log.info("%s: dropped %d queued text(s) of a request: %s", self.name, dropped, reason)
        return dropped

    def answered(self, ticket: Ticket, seconds: float) -> None:
        """A request was answered ``seconds`` after it reached the server: calibrates later estimates."""
        self.lateness.observe(ticket.request.estimate, seconds)

    def drain_s(self) -> float:
        """Seconds until the texts queued now are computed (calibrated; 0 before any measurement)."""
        with self._cond:
            queued, busy = self._queued_texts, self._busy
        return self.throughput.queue_seconds(queued, busy) * self.lateness.factor

    def health(self) -> WorkerHealth:
        worker = self._worker
        ready = worker.ready if worker is not None else None
        return WorkerHealth(
            profile=self.profile,
            running=ready is not None,
            pid=worker.pid if ready else None,
            model=ready.model if ready else None,
            dimension=ready.dimension if ready else None,
            fallback_reason=ready.fallback_reason if ready else None,
            device=ready.device if ready else None,
            batches=worker.batches if worker else 0,
            max_batch=self.cap,
        )

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
            self._busy = True
            try:
                self._run(batch)
            except Exception as exc:  # never leave a request hanging
                log.exception("%s: micro-batch failed unexpectedly", self.name)
                for part in batch:
                    part.request.fail(
                        ApiError(500, f"internal error ({type(exc).__name__})", code="internal_error")
                    )
            finally:
                self._busy = False
        self._stop_worker("shutdown")
        with self._cond:
            leftover, self._queue = list(self._queue), deque()
            self._queued_texts = 0
        for part in leftover:
            part.request.fail(ApiError(503, "the server is shutting down", code="shutting_down"))

    def _take(self) -> list[_Part] | None:
        """The next micro-batch; [] when the worker has been idle too long; None when closing."""
        with self._cond:
            while True:
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
                while self._queue and self._queued_texts < self.cap and not self._closing:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._queue or self._closing:
                    continue  # cancelled meanwhile, or closing: decided above
                batch = self._choose()
                self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)
                if batch:
                    return batch

    def tokens(self, chars: int) -> int:
        """Estimated tokens of a text of ``chars`` characters, special tokens included, after truncation."""
        return estimate_tokens(chars, self.chars_per_token, self.max_tokens)

    def _choose(self) -> list[_Part]:
        """The next micro-batch (under ``self._cond``): the oldest text's run in the cheapest cut of the
        first few batches' worth of the queue (:meth:`_group`)."""
        head = self._queue.popleft()
        self._queued_texts -= head.count
        while head.request.done and self._queue:  # its request failed meanwhile
            head = self._queue.popleft()
            self._queued_texts -= head.count
        if head.request.done:
            return []
        if head.solo:
            batch = [head]
            while self._queue and self._queue[0].request is head.request and len(batch) < self.cap:
                batch.append(self._queue.popleft())
                self._queued_texts -= batch[-1].count
            return batch
        window = []
        while self._queue and len(window) < min(4 * self.cap, WINDOW_TEXTS):
            part = self._queue.popleft()
            if part.request.done:
                self._queued_texts -= part.count
            else:
                window.append(part)
        batch = self._group(head, [p for p in window if not p.solo])
        chosen = {id(p) for p in batch}
        self._queue.extendleft(reversed([p for p in window if id(p) not in chosen]))
        self._queued_texts -= sum(p.count for p in batch[1:])
        return batch

    def _group(self, head: _Part, pool: list[_Part]) -> list[_Part]:
        """The micro-batch of ``head`` (first) in the cheapest cut of ``[head] + pool`` into batches of
        similar length (:func:`orchestrator.api.batching.head_batch`)."""
        candidates = [head, *pool]
        return head_batch(
            head,
            pool,
            tokens=[self.tokens(p.chars) for p in candidates],
            counts=[p.count for p in candidates],
            cap=self.cap,
            budget=self.settings.embed_max_batch_tokens,
            overhead=self.cost.overhead_tokens(),
        )

    def _learn(self, parts: list[_Part], tokens: list[int]) -> None:
        """Update the characters-per-token ratio from the worker's exact counts (texts not truncated)."""
        lengths = [n for part in parts for n in part.request.lengths[part.start : part.start + part.count]]
        self.chars_per_token = learn_chars_per_token(self.chars_per_token, lengths, tokens, self.max_tokens)

    def _requeue(self, parts: list[_Part]) -> None:
        with self._cond:
            self._queue.extendleft(reversed(parts))
            self._queued_texts += sum(p.count for p in parts)
            self.metrics.queue.labels(profile=self.profile).set(self._queued_texts)

    def _run(self, batch: list[_Part]) -> None:
        live = [p for p in batch if not p.request.done]
        if not live:
            return
        reply = self._attempt(live)
        if isinstance(reply, TaskFailed):
            self._isolate(live, reply.message)

    def _attempt(self, parts: list[_Part]) -> Embedded | TaskFailed | None:
        """Encode ``parts`` in one micro-batch and deliver the rows. Out of memory, a crash, a time-out or a
        failed start are dealt with here (None); a failure of the batch itself is returned."""
        try:
            worker = self._ensure_worker()
        except WorkerDied as exc:
            self._fail_start(parts, exc)
            return None
        texts = [t for part in parts for t in part.texts()]
        types = [part.request.input_type for part in parts for _ in range(part.count)]
        task = EmbedTask(task_id=next(self._task_ids), texts=texts, input_types=types if any(types) else None)
        sent = time.monotonic()
        self._busy = True
        try:
            reply = worker.call(task, timeout=self.settings.embed_batch_timeout_s)
        except WorkerDied as exc:
            self._crashed(parts, exc)
            return None
        finally:
            # computed: before the answers go out, so a client's next request sees no work in flight
            self._busy = False
        self._last_active = time.monotonic()
        if isinstance(reply, Embedded):
            self.cost.observe(reply.count * max(reply.tokens, default=0), self._last_active - sent)
            # back to back (texts were waiting when the last micro-batch ended), the rate is measured from that
            # end: the batching thread's own time and its wait for the server's GIL count, as they do for a
            # queued request
            since = self._last_done if self._backlog else sent
            self.throughput.observe(sum(reply.tokens), reply.count, self._last_active - since)
            self._last_done, self._backlog = self._last_active, bool(self._queued_texts)
            self._deliver(parts, reply, worker)
            return reply
        if reply.reason == "oom":
            decision = next_step(Outcome.OOM, len(texts), 0, 0, stage=self.name)
            log.warning("%s: %s", self.name, decision.reason)
            if decision.retry:
                self.cap = min(self.cap, decision.batch_size)
                self.metrics.oom_retries.labels(profile=self.profile).inc()
                self._requeue(parts)
            else:
                self._fail(parts, ApiError(503, decision.reason, code="out_of_memory"))
            return None
        return reply

    def _isolate(self, parts: list[_Part], message: str) -> None:
        """A micro-batch failed (not out of memory): bisect it until the failing texts are alone, so that
        only their requests fail. 400 when other texts encode (the text is at fault), 500 when none does."""
        units = [_Part(p.request, p.start + i, 1, p.crashes, p.solo) for p in parts for i in range(p.count)]
        bad: list[tuple[_Part, str]] = []
        encoded = False
        if len(units) == 1:
            bad.append((units[0], message))
        else:
            log.warning(
                "%s: a micro-batch of %d failed (%s); splitting it to find the text at fault",
                self.name,
                len(units),
                message,
            )
            half = len(units) // 2
            stack = [units[half:], units[:half]]
            while stack:
                group = [u for u in stack.pop() if not u.request.done]
                if not group:
                    continue
                reply = self._attempt(group)
                if isinstance(reply, Embedded):
                    encoded = True
                elif isinstance(reply, TaskFailed):
                    if len(group) == 1:
                        bad.append((group[0], reply.message))
                    else:
                        half = len(group) // 2
                        stack += [group[half:], group[:half]]
        if bad and not encoded:
            encoded = self._probe()
        for unit, why in bad:
            if encoded:
                log.warning("%s: input[%d] of a request cannot be embedded: %s", self.name, unit.start, why)
                self.metrics.bad_texts.labels(profile=self.profile).inc()
                unit.request.fail(
                    ApiError(
                        400,
                        f"input[{unit.start}] could not be embedded: {why}",
                        type="invalid_request_error",
                        param=f"input[{unit.start}]",
                        code="invalid_input",
                    )
                )
            else:
                log.error("%s: the worker cannot embed anything: %s", self.name, why)
                unit.request.fail(ApiError(500, f"the embedding worker failed: {why}", code="worker_error"))

    def _probe(self) -> bool:
        """Whether the worker embeds a plain text: tells a bad input from a broken worker."""
        worker = self._worker
        if worker is None:
            return False
        try:
            reply = worker.call(
                EmbedTask(task_id=next(self._task_ids), texts=["probe"]),
                timeout=self.settings.embed_batch_timeout_s,
            )
        except WorkerDied:
            self._discard_worker()
            return False
        return isinstance(reply, Embedded)

    def _deliver(self, parts: list[_Part], reply: Embedded, worker: WorkerProcess) -> None:
        rows = np.frombuffer(reply.vectors, dtype="<f4").reshape(reply.count, reply.dimension)
        model = worker.ready.model if worker.ready else self.profile
        typed = worker.ready.applies_input_types if worker.ready else False
        source = portable_name(worker.ready.model_path or worker.ready.model) if worker.ready else None
        worker.batches += 1
        recycle = (
            bool(self.settings.worker_recycle_after) and worker.batches >= self.settings.worker_recycle_after
        )
        if recycle:  # detached before the answers go out: whoever sees them sees the worker gone
            self._worker = None
        self.metrics.batch_size.labels(profile=self.profile).observe(reply.count)
        self.metrics.texts.labels(profile=self.profile).inc(reply.count)
        self.metrics.batch_seconds.labels(profile=self.profile).inc(reply.seconds)
        self._learn(parts, reply.tokens)
        offset = 0
        for part in parts:
            part.request.fill(
                part.start,
                rows[offset : offset + part.count],
                reply.tokens[offset : offset + part.count],
                model,
                typed,
                source,
            )
            offset += part.count
        if recycle:
            log.info(
                "%s: recycling worker pid %s after %d micro-batches", self.name, worker.pid, worker.batches
            )
            self.metrics.worker_restarts.labels(profile=self.profile, reason="recycle").inc()
            self._stop_process(worker, "recycle")

    def _crashed(self, parts: list[_Part], exc: WorkerDied) -> None:
        if exc.timed_out:
            self._timed_out(parts, exc)
            return
        outcome, sig = outcome_of(exc.exitcode) if exc.exitcode is not None else (Outcome.KILLED, None)
        pid = self._worker.pid if self._worker else None
        log.error(
            "%s: worker pid %s died mid-batch (%s%s)",
            self.name,
            pid,
            outcome.value,
            f", signal {sig}" if sig else "",
        )
        self._discard_worker()
        self.metrics.worker_restarts.labels(profile=self.profile, reason="crash").inc()
        retry = []
        for part in parts:
            decision = next_step(
                outcome, part.count, part.crashes, MAX_CRASH_RETRIES, signal=sig, stage=self.name
            )
            if decision.retry:
                part.crashes += 1
                if outcome is Outcome.OOM:
                    self.cap = min(self.cap, decision.batch_size)
                retry.append(part)
            else:
                part.request.fail(
                    ApiError(503, f"the embedding worker crashed: {decision.reason}", code="worker_crashed")
                )
        if retry:
            self.metrics.crash_retries.labels(profile=self.profile).inc(sum(p.count for p in retry))
            self._requeue(retry)

    def _timed_out(self, parts: list[_Part], exc: WorkerDied) -> None:
        """A micro-batch took longer than its limit: the worker was killed; replace it. Texts of several
        requests are retried one request at a time, so only the request whose text hangs fails (503)."""
        pid = self._worker.pid if self._worker else None
        log.error("%s: worker pid %s killed: %s", self.name, pid, exc.message)
        self._discard_worker()
        self.metrics.worker_restarts.labels(profile=self.profile, reason="timeout").inc()
        several = len({id(p.request) for p in parts}) > 1
        retry = [p for p in parts if several and not p.solo]
        for part in parts:
            if several and not part.solo:
                part.solo, part.crashes = True, part.crashes + 1
            else:
                part.request.fail(
                    ApiError(
                        503,
                        f"the embedding worker did not finish this request's micro-batch "
                        f"within {self.settings.embed_batch_timeout_s:g}s and was replaced",
                        code="worker_timeout",
                    )
                )
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
        self._fail(
            parts,
            ApiError(
                503,
                f"embedding model for {self.profile!r} is unavailable: {reason}",
                code="model_unavailable",
            ),
        )

    def _fail(self, parts: list[_Part], error: ApiError) -> None:
        for part in parts:
            part.request.fail(error)

    def _ensure_worker(self) -> WorkerProcess:
        if self._worker is not None and self._worker.proc.exitcode is not None:  # died while idle
            log.error(
                "%s: worker pid %s died while idle (exit code %s); starting a new one",
                self.name,
                self._worker.pid,
                self._worker.proc.exitcode,
            )
            self._discard_worker()
            self.metrics.worker_restarts.labels(profile=self.profile, reason="crash").inc()
        if self._worker is not None:
            return self._worker
        self._starts += 1
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        log_path = (
            Path(self.settings.server_dir)
            / "workers"
            / f"{self.name}-{stamp}-{os.getpid()}-{self._starts}.log"
        )
        worker = WorkerProcess(self.config, log_path)
        self.metrics.worker_starts.labels(profile=self.profile).inc()
        log.info("%s: starting worker pid %s (log %s)", self.name, worker.pid, log_path)
        try:
            ready = worker.wait_ready(self.settings.worker_start_timeout_s)
        except WorkerDied:
            worker.stop(grace_s=0)
            raise
        self._worker = worker
        self.max_tokens = ready.max_seq_length
        self._last_active = time.monotonic()
        self.metrics.workers_up.labels(profile=self.profile).set(1)
        log.info(
            "%s: worker pid %d ready: %s (%s) on %s",
            self.name,
            ready.pid,
            ready.model,
            ready.model_path,
            ready.device,
        )
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

    def _stop_process(self, worker: WorkerProcess, reason: str) -> None:
        log.info("%s: stopping worker pid %s (%s)", self.name, worker.pid, reason)
        worker.stop()
        self.cap = self.settings.embed_max_batch  # a fresh worker starts from the configured cap again
        self.metrics.worker_stops.labels(profile=self.profile, reason=reason).inc()
        self.metrics.workers_up.labels(profile=self.profile).set(0)


class EmbeddingPool:
    """The profiles' workers, created on first use."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        module: str = WORKER_MODULE,
        options: dict | None = None,
    ) -> None:
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
                self._workers[profile] = ProfileWorker(
                    profile, self.settings, self.metrics, self.module, self.options
                )
            return self._workers[profile]

    def embed(
        self, profile: str, texts: list[str], input_type: str | None = None
    ) -> concurrent.futures.Future[EmbedResult]:
        return self.worker(profile).submit(texts, input_type)

    def ticket(
        self, profile: str, texts: list[str], waited_s: float = 0.0, input_type: str | None = None
    ) -> Ticket:
        """Queue ``texts`` (all of one ``input_type``); the ticket's future gets the rows, ``cancel`` drops what
        is still queued (429 when full)."""
        return self.worker(profile).ticket(texts, waited_s, input_type)

    def workers(self) -> list[ProfileWorker]:
        with self._lock:
            return list(self._workers.values())

    def health(self) -> list[WorkerHealth]:
        return [w.health() for w in self.workers()]

    def drain_s(self) -> float:
        """Seconds until every profile's queued texts are computed (the longest queue)."""
        return max((w.drain_s() for w in self.workers()), default=0.0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
        for worker in workers:
            worker.close()
