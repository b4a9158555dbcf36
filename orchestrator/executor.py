"""Start a stage child in a fresh interpreter and wait for it.

Children come from ``multiprocess.get_context("spawn")``: a new Python
process with its own CUDA context, which the driver frees entirely when the
process exits. The child's stdout and stderr (its logs, and native libraries'
output) go to a per-attempt log file that the parent tails into its own log,
prefixed with the stage name.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import multiprocess

from contracts import ExitCode
from orchestrator.gpu import StageGpuCheck
from orchestrator.outcome import Outcome, outcome_of
from orchestrator.watch import ChildWatch

log = logging.getLogger(__name__)
child_log = logging.getLogger("orchestrator.child")

_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def _child_entry(request_path: str, log_path: str) -> None:
    """Spawn target: runs in the child only; the parent never imports stage code."""
    from importlib import import_module

    import_module("stages.child").main(request_path, log_path)


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


class LocalExecutor:
    """Runs each stage request in a spawned child on this machine."""

    def __init__(self, watch: ChildWatch | None = None) -> None:
        self._ctx = multiprocess.get_context("spawn")
        self._running: dict[int, object] = {}
        self._lock = threading.Lock()
        #: pid files, GPU checks and performance log around each child (orchestrator.watch)
        self.watch = watch if watch is not None else ChildWatch.default()

    def run(self, stage: str, request_path: Path, log_path: Path) -> ChildExit:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        watching = self.watch.before(stage, request_path)
        if watching.refused:  # not enough free GPU memory: fail the items with the reason, start nothing
            return ChildExit(exitcode=int(ExitCode.FAILED), outcome=Outcome.ERROR, signal=None, wall_s=0.0, pid=None,
                             last_error=watching.refused)
        tail = _LogTail(stage, log_path)
        proc = self._ctx.Process(
            target=_child_entry, args=(str(request_path), str(log_path)), name=f"stage-{stage}", daemon=True
        )
        started = time.perf_counter()
        proc.start()
        with self._lock:
            self._running[proc.pid] = proc
        self.watch.started(watching, proc.pid)
        tail.start()
        try:
            proc.join()
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
            if proc.exitcode is None:  # interrupted while waiting: never leave a child behind
                _stop(proc)
            tail.stop()
            outcome, signal = outcome_of(proc.exitcode)
            wall_s = time.perf_counter() - started
            gpu = self.watch.exited(watching, outcome.value, wall_s)
        return ChildExit(
            exitcode=proc.exitcode,
            outcome=outcome,
            signal=signal,
            wall_s=wall_s,
            pid=proc.pid,
            last_error=tail.last_error,
            gpu=gpu,
        )

    def running_pids(self) -> list[int]:
        with self._lock:
            return list(self._running)

    def stop_all(self) -> None:
        """Stop every child this executor started (SIGTERM, then SIGKILL)."""
        with self._lock:
            procs = list(self._running.values())
        for proc in procs:
            _stop(proc)


def _stop(proc, grace_s: float = 5.0) -> None:
    if proc.exitcode is not None:
        return
    log.warning("stopping stage child pid %s", proc.pid)
    proc.terminate()
    proc.join(grace_s)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


class _LogTail:
    """Follows a child's log file and re-logs each line as ``[stage] line``."""

    def __init__(self, stage: str, path: Path) -> None:
        self.stage = stage
        self.path = path
        self.last_error: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"tail-{stage}", daemon=True)

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
                        self._emit(line)
                elif self._done.is_set():
                    break
                else:
                    time.sleep(0.05)
            if pending:
                self._emit(pending)

    def _emit(self, line: str) -> None:
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
