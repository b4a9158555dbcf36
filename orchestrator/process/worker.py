"""The embedding worker's child process as the pool sees it: spawn, pipe, stop.

:class:`WorkerProcess` starts ``stages.workers.embeddings`` (or a test double) in a ``multiprocess`` spawn
child through the process toolkit, relays its log file, sends it :class:`~contracts.worker.EmbedTask`
messages over a pipe and reads the replies; a child that ends, or does not answer in time (then it is
killed), raises :class:`WorkerDied`. What follows is decided by the pool (``orchestrator.api.workers``).
"""

from __future__ import annotations

import time
from pathlib import Path

from multiprocess.connection import wait as wait_for

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

WORKER_MODULE = "stages.workers.embeddings"


class WorkerDied(Exception):  # noqa: N818 - an event the pool handles itself, never raised to a caller
    """The worker process ended while the server waited for it (or was killed for taking too long)."""

    def __init__(self, exitcode: int | None, message: str | None = None, timed_out: bool = False) -> None:
        self.exitcode = exitcode
        self.message = message
        self.timed_out = timed_out
        super().__init__(message or f"worker exited with {exitcode}")


class WorkerProcess:
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
        self.proc = spawn(
            f"{WORKER_MODULE}:main", (child_conn, config.model_dump_json(), str(log_path)), name=config.name
        )
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

    def call(self, task: EmbedTask, timeout: float | None = None) -> Embedded | TaskFailed:
        try:
            self.conn.send(TO_WORKER.dump_python(task))
        except OSError:  # it died before the task reached it: its end of the pipe is closed
            self.proc.join(5)
            raise WorkerDied(self.proc.exitcode) from None
        reply = self._receive(timeout, f"micro-batch of {len(task.texts)} not done within {timeout}s")
        if not isinstance(reply, (Embedded, TaskFailed)) or reply.task_id != task.task_id:
            raise WorkerDied(None, f"unexpected reply {type(reply).__name__} to task {task.task_id}")
        return reply

    def _receive(self, timeout: float | None, late: str | None = None):
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
                raise WorkerDied(
                    self.proc.exitcode, late or f"model not loaded within {timeout:.0f}s", timed_out=True
                )

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
