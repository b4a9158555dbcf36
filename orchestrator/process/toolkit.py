"""One way to start, follow and stop the child processes of this project.

Every child (a stage child, an embedding worker, a stage child inside a Ray
task) is started by :func:`spawn`: a fresh interpreter from
``multiprocess.get_context("spawn")`` (so a fresh CUDA context), that ignores
Ctrl-C (the parent owns it) and, on Linux, gets SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), so a ``kill -9`` of the parent leaves no orphan holding
the GPU. Its output goes to a log file that the parent re-logs line by line
(:func:`following`), and :func:`stop` / :func:`stop_tree` are the one
terminate → wait → kill routine, for our own children and for orphans a crashed
run left behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import multiprocess
import psutil
from multiprocess import resource_tracker

from contracts import ExitCode

log = logging.getLogger(__name__)
#: child log lines are re-logged under this name, prefixed with the child's label
child_log = logging.getLogger("orchestrator.child")

CONTEXT = multiprocess.get_context("spawn")

_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


# -- starting ----------------------------------------------------------------------------------


def spawn(entry: str, args: Sequence, *, name: str, die_with_parent: bool = True):
    """Start ``entry`` (``"module:function"``) in a fresh spawned interpreter, called with ``args``.

    The parent imports nothing of ``entry``: the child imports it. Returns the started process.
    """
    parent = os.getpid() if die_with_parent else None
    proc = CONTEXT.Process(target=_bootstrap, args=(entry, tuple(args), parent), name=name, daemon=True)
    # Ctrl-C reaches the terminal's whole process group: a child still starting (its interpreter, the
    # unpickling of its target) would die of it with a traceback on the console. It starts with SIGINT
    # blocked (the mask survives fork and exec) and unblocks it once it ignores it (_bootstrap); this
    # thread's mask is restored at once, so the parent gets its Ctrl-C as before. multiprocess's resource
    # tracker is started first: starting it unblocks SIGINT (its own guard of the same race, bpo-33613).
    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return proc


def _bootstrap(entry: str, args: tuple, parent_pid: int | None) -> None:
    """Spawn target (runs in the child only)."""
    from importlib import import_module

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C for all its children
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started (spawn)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    module, _, function = entry.partition(":")
    getattr(import_module(module), function)(*args)


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when its parent dies; leave at once if the parent is already gone."""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(int(ExitCode.INTERRUPTED))


# -- stopping ----------------------------------------------------------------------------------


class Stoppable(Protocol):
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float) -> bool:
        """True once the process has exited (and, for our own children, been reaped)."""


class _Handle:
    """A process to stop: ``terminate`` / ``kill`` go to it; subclasses say how to wait for it."""

    def __init__(self, proc) -> None:
        self.proc = proc

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()


class _OwnChild(_Handle):
    """A process we spawned: waiting reaps it through ``multiprocess`` (so its exit code is kept)."""

    def wait(self, timeout: float) -> bool:
        self.proc.join(timeout)
        return self.proc.exitcode is not None


class _Other(_Handle):
    """Any other process (a grandchild, an orphan of a crashed run), through psutil."""

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
        except psutil.TimeoutExpired:
            return not _running(self.proc)
        except psutil.NoSuchProcess:
            pass
        return True


def terminate_wait_kill(targets: Sequence[Stoppable], grace_s: float) -> list[Stoppable]:
    """SIGTERM every target, wait up to ``grace_s``, SIGKILL the rest, wait again; returns those still running."""
    for action in ("terminate", "kill"):
        for target in targets:
            try:
                getattr(target, action)()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        deadline = time.monotonic() + grace_s
        targets = [t for t in targets if not t.wait(max(0.0, deadline - time.monotonic()))]
        if not targets:
            break
    return list(targets)


def _descendants(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop(proc, grace_s: float = 5.0) -> None:
    """Stop a child we spawned and anything it started (SIGTERM, then SIGKILL after ``grace_s``)."""
    if proc.exitcode is not None:
        return
    log.warning("stopping child %s (pid %s)", proc.name, proc.pid)
    left = terminate_wait_kill([*map(_Other, _descendants(proc.pid)), _OwnChild(proc)], grace_s)
    if left:  # only an unkillable (D-state) process stays; reap ours when it finally goes
        proc.join()


def stop_tree(pid: int, grace_s: float) -> str | None:
    """Stop ``pid`` (not our child) and its descendants; None when they are gone, else why not."""
    return stop_trees([pid], grace_s)


def stop_trees(pids: Sequence[int], grace_s: float) -> str | None:
    """Stop every process of ``pids`` (not our children) and their descendants at once: all asked to stop,
    then one ``grace_s`` for all of them before the rest are killed. None when they are gone, else why not."""
    procs = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            continue
        except psutil.Error as exc:
            return str(exc)
    try:
        left = terminate_wait_kill([_Other(p) for p in procs], grace_s)
    except psutil.Error as exc:
        return f"cannot signal pid {', '.join(map(str, pids))}: {exc}"
    return f"still running: {[t.proc.pid for t in left]}" if left else None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- following ---------------------------------------------------------------------------------


@contextmanager
def following(
    log_path: Path, label: str, progress: tuple[Path, Callable[[str], None]] | None = None
) -> Iterator[LogRelay]:
    """While the block runs, re-log the child's log as ``[label] ...`` and hand each line of its
    progress file (if any) to the callback; yields the :class:`LogRelay` (its ``last_error`` is
    complete once the block is left)."""
    relay = LogRelay(label)
    follows = [FileFollower(log_path, relay)]
    if progress is not None:
        progress[0].touch()
        follows.append(FileFollower(*progress))
    for follow in follows:
        follow.start()
    try:
        yield relay
    finally:
        for follow in follows:
            follow.stop()


class FileFollower:
    """Follows a file a child appends to, handing each complete line to ``on_line`` (in a thread)."""

    def __init__(self, path: Path, on_line: Callable[[str], None]) -> None:
        self.path = path
        self.on_line = on_line
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"follow-{path.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Hand on what the file holds now, then stop."""
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
        except Exception:  # a display problem must not stop the run
            log.exception("while handling a line of %s", self.path)


class LogRelay:
    """Re-logs each line of a child's log as ``[label] line`` at the child's level; keeps the last ERROR."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.last_error: str | None = None

    def __call__(self, line: str) -> None:
        line = line.rstrip()
        if not line:
            return
        word, _, rest = line.partition(" ")
        level = _LEVELS.get(word)
        if level is None:
            child_log.info("[%s] %s", self.label, line)
            return
        if level >= logging.ERROR:
            self.last_error = rest.split(": ", 1)[-1]
        child_log.log(level, "[%s] %s", self.label, rest)
