"""Executors: how a stage request becomes a process that runs it.

:class:`Executor` is the interface the pipeline uses; :class:`LocalExecutor`
(default) spawns each child on this machine, ``orchestrator.scale.ray_executor``
runs the same children as Ray tasks across GPUs and machines.

A request object goes in; the executor writes it where the child reads it,
starts the child (:func:`orchestrator.process.toolkit.spawn`: fresh
interpreter, fresh CUDA context, dies with the parent), re-logs the child's log
prefixed with the stage name, runs the hooks around it
(:mod:`orchestrator.process.hooks`), and hands back how the child ended and its
validated result, read once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts import InFlight, StageRequest, StageResult, load_model, save_model
from contracts.errors import ArtifactError
from contracts.report import Attempt
from orchestrator.gpu.guard import StageGpuCheck
from orchestrator.process.hooks import ChildHook, ChildRun, default_hooks
from orchestrator.process.outcome import Outcome, outcome_of
from orchestrator.process.toolkit import FORK_SERVER, exit_status, following, spawn, stop

log = logging.getLogger(__name__)

#: the spawn target of every stage child
CHILD_ENTRY = "stages.runtime.child:main"


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
    #: when it was started (seconds since the epoch)
    spawned: float | None = None


@dataclass(frozen=True)
class ChildExit:
    #: the process's exit status (negative: killed by that signal); None when it was never started
    exitcode: int | None
    outcome: Outcome
    signal: int | None
    wall_s: float
    pid: int | None
    #: the child's last ERROR line (or why it was not started), for one-line failure messages
    last_error: str | None
    #: what NVML saw of the child (None without NVML, or on the CPU)
    gpu: StageGpuCheck | None = None
    #: the child's telemetry record (every executor sets it: run report and performance log share it)
    record: Attempt | None = None
    #: the items the child was working on when it ended (None: it was between items, or said nothing)
    in_flight: list[str] | None = None
    #: the watchdog stopped it: no progress within its limit
    hung: bool = False


class Executor(Protocol):
    """What the pipeline needs from an executor: nothing here knows what a stage does.

    A :class:`~contracts.StageRequest` goes in (written by the executor to ``request_path``,
    where the child reads it); how the process ended and its validated ``StageResult`` (None
    when it wrote none) come out once it has exited and its artifacts, progress lines and
    result are where the request says.
    """

    def run(
        self,
        request: StageRequest,
        request_path: Path,
        log_path: Path,
        progress: tuple[Path, Callable[[str], None]] | None = None,
        warm: WarmChild | None = None,
        gpu: bool = True,
    ) -> tuple[ChildExit, StageResult | None]:
        """Run the request in a fresh process and wait; ``gpu``: the stage wants a GPU if there is one."""

    def warm_up(
        self, stage: str, module: str, request_path: Path, log_path: Path, env: dict[str, str] | None = None
    ) -> WarmChild | None:
        """Start the process for a request written later, or None when the executor cannot. ``env`` is what
        the request will carry (``StageRequest.env``): the process applies it before it imports anything,
        since some libraries read their settings once, on import (``HF_HUB_OFFLINE``)."""

    def cancel(self, warm: WarmChild) -> None:
        """Stop a warm process whose request will never come."""

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop everything this executor started."""

    def slots(self) -> int:
        """How many stage processes can usefully run at once (chunks in flight)."""

    def close(self) -> None:
        """Release what the executor holds (connections, clusters it started)."""


@dataclass(frozen=True)
class Watchdog:
    """How long a child may work on one item: ``floor_s``, or ``per_audio_s`` seconds per second of its audio."""

    floor_s: float
    per_audio_s: float

    @classmethod
    def from_settings(cls, settings) -> Watchdog:
        return cls(settings.watchdog_floor_s, settings.watchdog_per_audio_s)

    def limit_s(self, audio_s: float | None) -> float:
        return max(self.floor_s, self.per_audio_s * (audio_s or 0.0))

    def overdue(self, in_flight: InFlight | None, now: float) -> float | None:
        """The limit the item in flight has passed, or None."""
        if in_flight is None:
            return None
        limit = self.limit_s(in_flight.audio_s)
        return limit if now - in_flight.since > limit else None


class LocalExecutor:
    """Runs each stage request in a spawned child on this machine (one GPU: one chunk at a time)."""

    def __init__(
        self,
        hooks: list[ChildHook] | None = None,
        die_with_parent: bool = True,
        watchdog: Watchdog | None = None,
        node: str | None = None,
        start_method: str = "spawn",
    ) -> None:
        """``hooks`` run around every child (default: :func:`~orchestrator.process.hooks.default_hooks`);
        ``die_with_parent``: children get SIGKILL when this process dies (Linux); without it, a killed
        parent leaves orphans that only ``pipeline gpu --cleanup`` stops. ``node``: the Ray node this
        executor runs on (a Ray task's), named in every child's record. ``start_method``: "spawn" (a fresh
        interpreter per child) or "forkserver" (forked from a fork server that imported every stage's
        libraries, :class:`~orchestrator.process.toolkit.ForkServer`)."""
        self.die_with_parent = die_with_parent
        self.start_method = start_method
        self.node = node
        self._running: dict[int, object] = {}
        self._lock = threading.Lock()
        self.hooks = hooks if hooks is not None else default_hooks()
        #: stops a child that makes no progress on an item (None: never)
        self.watchdog = watchdog

    def warm_up(
        self, stage: str, module: str, request_path: Path, log_path: Path, env: dict[str, str] | None = None
    ) -> WarmChild | None:
        """Start the child for a request that will be written at ``request_path`` later (see :class:`WarmChild`);
        None with the fork server still importing (it is started if need be)."""
        if self.start_method == "forkserver" and not FORK_SERVER.ready.is_set():
            FORK_SERVER.ensure_running(env or {})
            return None  # the server still imports: its child, forked at its turn, imports nothing
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        spawned = time.time()
        proc = self._spawn(stage, request_path, log_path, module, env)
        log.debug("%s: warm child %d importing ahead of its request", stage, proc.pid)
        return WarmChild(stage, request_path, log_path, proc, spawned)

    def cancel(self, warm: WarmChild) -> None:
        """Stop a warm child whose request will never come."""
        with self._lock:
            self._running.pop(warm.proc.pid, None)
        stop(warm.proc, grace_s=2.0)

    def _spawn(
        self,
        stage: str,
        request_path: Path,
        log_path: Path,
        module: str | None = None,
        env: dict[str, str] | None = None,
        gpu: bool = True,
    ):
        proc = spawn(
            CHILD_ENTRY,
            (str(request_path), str(log_path), module, env),
            name=f"stage-{stage}",
            die_with_parent=self.die_with_parent,
            method=self.start_method,
            env=env,
            # a CPU stage (audio: no torch) does not wait for the fork server's imports: it is spawned
            wait_for_server=gpu,
        )
        with self._lock:
            self._running[proc.pid] = proc
        return proc

    def run(
        self,
        request: StageRequest,
        request_path: Path,
        log_path: Path,
        progress: tuple[Path, Callable[[str], None]] | None = None,
        warm: WarmChild | None = None,
        gpu: bool = True,
    ) -> tuple[ChildExit, StageResult | None]:
        """Run one request in a fresh child (or in ``warm``, started for it) and wait.

        ``progress`` = (file, callback per line it gains); ``gpu`` is for executors that place
        work (the child sees whatever this machine's settings make visible).
        """
        stage = request.stage
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        child = ChildRun(request=request, request_path=Path(request_path), node=self.node)
        entered: list[ChildHook] = []
        for hook in self.hooks:
            entered.append(hook)
            child.refused = hook.before(child)
            if child.refused:
                break
        if child.refused:  # e.g. not enough free GPU memory: fail the items with the reason, start nothing
            if warm is not None:
                self.cancel(warm)
            save_model(request, request_path)  # the record of what was refused (no child will read it)
            child.outcome = Outcome.REFUSED
            for hook in reversed(entered):
                hook.exited(child)
            return ChildExit(
                exitcode=None,
                outcome=Outcome.REFUSED,
                signal=None,
                wall_s=0.0,
                pid=None,
                last_error=child.refused,
                record=child.record(),
            ), None
        # written after the hooks' ``before`` (the GPU guard's baseline, the perf log's stage_start): a warm
        # child starts the moment it sees it. Atomic: the child sees it whole
        save_model(request, request_path)
        started, child.handed = time.perf_counter(), time.time()
        with following(log_path, stage, progress) as relay:
            if warm is not None:
                proc, child.spawned = warm.proc, warm.spawned
            else:
                child.spawned = time.time()
                proc = self._spawn(stage, request_path, log_path, env=request.env, gpu=gpu)
            child.pid = proc.pid
            for hook in self.hooks:
                hook.started(child)
            hung = None
            try:
                hung = self._wait(proc, request)
            finally:
                with self._lock:
                    self._running.pop(proc.pid, None)
                if proc.exitcode is None:  # interrupted while waiting: never leave a child behind
                    stop(proc)
                exitcode = exit_status(proc)
                outcome, signal = outcome_of(exitcode)
                child.outcome, child.signal, child.wall_s = outcome, signal, time.perf_counter() - started
                child.exited = time.time()
                child.result = read_result(request, outcome)
                for hook in reversed(self.hooks):
                    hook.exited(child)
        last_error = relay.last_error
        if hung is not None:
            last_error = (
                f"no progress within {hung:.0f} s (watchdog; PIPELINE_WATCHDOG_FLOOR_S / _PER_AUDIO_S)"
            )
        in_flight = read_in_flight(request)
        return ChildExit(
            exitcode=exitcode,
            outcome=outcome,
            signal=signal,
            wall_s=child.wall_s,
            pid=proc.pid,
            last_error=last_error,
            gpu=child.gpu,
            record=child.record(),
            in_flight=in_flight.ids if in_flight else None,
            hung=hung is not None,
        ), child.result

    def _wait(self, proc, request: StageRequest) -> float | None:
        """Wait for the child; stop it when the watchdog says it hangs (returns the limit it passed)."""
        while True:
            proc.join(1.0)
            if proc.exitcode is not None:
                return None
            if self.watchdog is None:
                continue
            in_flight = read_in_flight(request)
            limit = self.watchdog.overdue(in_flight, time.time())
            if limit is not None:
                log.error(
                    "%s: no progress on %s within %.0f s: stopping the child",
                    request.stage,
                    ", ".join(in_flight.ids),
                    limit,
                )
                stop(proc, grace_s=5.0)
                return limit

    def slots(self) -> int:
        return 1

    def close(self) -> None:
        self.stop_all()

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every child this executor started (SIGTERM, then SIGKILL after ``grace_s``)."""
        with self._lock:
            procs = list(self._running.values())
        for proc in procs:
            stop(proc, grace_s)


def read_in_flight(request: StageRequest) -> InFlight | None:
    """What the child said it was working on (None: nothing, or between items)."""
    if not request.inflight_path or not Path(request.inflight_path).exists():
        return None
    try:
        return load_model(request.inflight_path, InFlight)
    except ArtifactError:
        return None


def read_result(request: StageRequest, outcome: Outcome) -> StageResult | None:
    """The child's validated result for ``request``, or None (logged) when there is no usable one."""
    path = Path(request.result_path)
    if not path.exists():
        if outcome is Outcome.OK:
            log.error("%s: child exited cleanly but wrote no result", request.stage)
        return None
    try:
        result = load_model(path, StageResult)
    except ArtifactError as exc:
        log.error("%s: ignoring unusable result: %s", request.stage, exc)
        return None
    if result.request_id != request.request_id:
        log.error("%s: result %s answers another request (%s)", request.stage, path, result.request_id)
        return None
    return result
