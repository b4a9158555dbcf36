"""Executors: how a stage request becomes a process that runs it.

:class:`Executor` is the interface the pipeline uses; :class:`LocalExecutor`
(default) spawns each child on this machine, ``orchestrator.scale.ray_executor``
runs the same children as Ray tasks across GPUs and machines.

Local children come from ``multiprocess.get_context("spawn")``: a new Python
process with its own CUDA context, which the driver frees entirely when the
process exits. The child's stdout and stderr (its logs, and native libraries'
output) go to a per-attempt log file that the parent tails into its own log,
prefixed with the stage name.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import multiprocess

from contracts import ExitCode
from orchestrator.gpu.nvml import StageGpuCheck
from orchestrator.run.outcome import Outcome, outcome_of
from orchestrator.process.watch import ChildWatch

log = logging.getLogger(__name__)
child_log = logging.getLogger("orchestrator.child")

_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def _child_entry(request_path: str, log_path: str, parent_pid: int | None, module: str | None = None) -> None:
    """Spawn target: runs in the child only; the parent never imports stage code."""
    from importlib import import_module

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C for the whole run
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    import_module("stages.child").main(request_path, log_path, module)


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this child when the parent dies (kill -9 of the parent leaves no orphan on the GPU)."""
    if sys.platform != "linux":
        return

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


@dataclass
class WarmChild:
    """A child started before its request exists: it imports its stage's libraries, then waits.

    It loads no model and touches no GPU until the request file appears, so it can
    import while the previous stage computes, hiding seconds of import per stage.
    """

    stage: str
    request_path: Path
    log_path: Path
    proc: object


@dataclass(frozen=True)
class ChildExit:
    exitcode: int
    outcome: Outcome
    signal: int | None
    wall_s: float
    pid: int | None
    #: the child's last ERROR line, for one-line failure messages
    last_error: str | None
    #: what NVML saw of the child (None without NVML, or on the CPU)
    gpu: StageGpuCheck | None = None


class Executor(Protocol):
    """What the pipeline needs from an executor: nothing here knows what a stage does.

    A request file (``contracts.StageRequest``) goes in; a :class:`ChildExit` comes
    out once the process that ran it has exited and its artifacts, progress lines
    and result file are where the request says.
    """

    def run(self, stage: str, request_path: Path, log_path: Path,
            progress: tuple[Path, Callable[[str], None]] | None = None, warm: WarmChild | None = None,
            gpu: bool = True) -> ChildExit:
        """Run the request in a fresh process and wait; ``gpu``: the stage wants a GPU if there is one."""

    def warm_up(self, stage: str, module: str, request_path: Path, log_path: Path) -> WarmChild | None:
        """Start the process for a request written later, or None when the executor cannot."""

    def cancel(self, warm: WarmChild) -> None:
        """Stop a warm process whose request will never come."""

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop everything this executor started."""

    def slots(self) -> int:
        """How many stage processes can usefully run at once (chunks in flight)."""

    def close(self) -> None:
        """Release what the executor holds (connections, clusters it started)."""


class LocalExecutor:
    """Runs each stage request in a spawned child on this machine (one GPU: one chunk at a time)."""

    def __init__(self, watch: ChildWatch | None = None, die_with_parent: bool = True) -> None:
        """``die_with_parent``: children get SIGKILL when this process dies (Linux); without it, a
        killed parent leaves orphans that only ``pipeline gpu --cleanup`` stops."""
        self._ctx = multiprocess.get_context("spawn")
        self.die_with_parent = die_with_parent
        self._running: dict[int, object] = {}
        self._lock = threading.Lock()
        #: pid files, GPU checks and performance log around each child (orchestrator.process.watch)
        self.watch = watch if watch is not None else ChildWatch.default()

    def warm_up(self, stage: str, module: str, request_path: Path, log_path: Path) -> WarmChild:
        """Start the child for a request that will be written at ``request_path`` later (see :class:`WarmChild`)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        proc = self._spawn(stage, request_path, log_path, module)
        log.debug("%s: warm child %d importing ahead of its request", stage, proc.pid)
        return WarmChild(stage, request_path, log_path, proc)

    def cancel(self, warm: WarmChild) -> None:
        """Stop a warm child whose request will never come."""
        with self._lock:
            self._running.pop(warm.proc.pid, None)
        _stop(warm.proc, grace_s=2.0)

    def _spawn(self, stage: str, request_path: Path, log_path: Path, module: str | None = None):
        parent = os.getpid() if self.die_with_parent else None
        proc = self._ctx.Process(target=_child_entry, args=(str(request_path), str(log_path), parent, module),
                                 name=f"stage-{stage}", daemon=True)
        proc.start()
        with self._lock:
            self._running[proc.pid] = proc
        return proc

    def run(self, stage: str, request_path: Path, log_path: Path,
            progress: tuple[Path, Callable[[str], None]] | None = None, warm: WarmChild | None = None,
            gpu: bool = True) -> ChildExit:
        """Run one request in a fresh child (or in ``warm``, started for it) and wait.

        ``progress`` = (file, callback per line it gains); ``gpu`` is for executors that place
        work (the child sees whatever this machine's settings make visible).
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        watching = self.watch.before(stage, request_path)
        if watching.refused:  # not enough free GPU memory: fail the items with the reason, start nothing
            if warm is not None:
                self.cancel(warm)
            return ChildExit(exitcode=int(ExitCode.FAILED), outcome=Outcome.ERROR, signal=None, wall_s=0.0, pid=None,
                             last_error=watching.refused)
        started = time.perf_counter()
        with following(log_path, stage, progress) as log_lines:
            proc = warm.proc if warm is not None else self._spawn(stage, request_path, log_path)
            self.watch.started(watching, proc.pid)
            try:
                proc.join()
            finally:
                with self._lock:
                    self._running.pop(proc.pid, None)
                if proc.exitcode is None:  # interrupted while waiting: never leave a child behind
                    _stop(proc)
                outcome, signal = outcome_of(proc.exitcode)
                wall_s = time.perf_counter() - started
                gpu = self.watch.exited(watching, outcome.value, wall_s)
        return ChildExit(
            exitcode=proc.exitcode,
            outcome=outcome,
            signal=signal,
            wall_s=wall_s,
            pid=proc.pid,
            last_error=log_lines.last_error,
            gpu=gpu,
        )

    def slots(self) -> int:
        return 1

    def close(self) -> None:
        self.stop_all()

    def running_pids(self) -> list[int]:
        with self._lock:
            return list(self._running)

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every child this executor started (SIGTERM, then SIGKILL after ``grace_s``)."""
        with self._lock:
            procs = list(self._running.values())
        for proc in procs:
            _stop(proc, grace_s)


def _stop(proc, grace_s: float = 5.0) -> None:
    if proc.exitcode is not None:
        return
    log.warning("stopping stage child pid %s", proc.pid)
    proc.terminate()
    proc.join(grace_s)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


@contextmanager
def following(log_path: Path, label: str, progress: tuple[Path, Callable[[str], None]] | None = None):
    """While the block runs, re-log the child's log as ``[label] ...`` and hand each line of its
    progress file (if any) to the callback; yields the :class:`_LogLines` (its ``last_error`` is
    complete once the block is left)."""
    log_lines = _LogLines(label)
    follows = [_Follow(log_path, log_lines)]
    if progress is not None:
        progress[0].touch()
        follows.append(_Follow(*progress))
    for follow in follows:
        follow.start()
    try:
        yield log_lines
    finally:
        for follow in follows:
            follow.stop()


class _Follow:
    """Follows a file a child appends to, handing each complete line to ``on_line``."""

    def __init__(self, path: Path, on_line: Callable[[str], None]) -> None:
        self.path = path
        self.on_line = on_line
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"follow-{path.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _follow(self) -> None:
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            pending = ""
            while True:
                chunk = fh.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        self._safe(line)
                elif self._done.is_set():
                    break
                else:
                    time.sleep(0.05)
            if pending:
                self._safe(pending)

    def _safe(self, line: str) -> None:
        try:
            self.on_line(line)
        except Exception:  # noqa: BLE001 - a display problem must not stop the run
            log.exception("while handling a line of %s", self.path)


class _LogLines:
    """Re-logs each line of a child's log as ``[stage] line`` at the child's level."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.last_error: str | None = None

    def __call__(self, line: str) -> None:
        line = line.rstrip()
        if not line:
            return
        word, _, rest = line.partition(" ")
        level = _LEVELS.get(word)
        if level is None:
            child_log.info("[%s] %s", self.stage, line)
            return
        if level >= logging.ERROR:
            self.last_error = rest.split(": ", 1)[-1]
        child_log.log(level, "[%s] %s", self.stage, rest)
