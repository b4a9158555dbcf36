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

With ``method="forkserver"`` (``PIPELINE_START_METHOD``) the child is forked instead from a fork server: a
fresh interpreter this process starts once (never this process: it imports no torch) that has imported every
stage's libraries (``stages.runtime.preload``) and never touched a GPU, so the child skips seconds of imports
and still creates its own CUDA context. The same guarantees hold: Ctrl-C ignored, the log, and death with
this process (the child's parent is the server, so it also watches this process: :func:`_watch_parent`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
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
from multiprocess import forkserver as _forkserver
from multiprocess import resource_tracker

from contracts import ExitCode

log = logging.getLogger(__name__)
#: child log lines are re-logged under this name, prefixed with the child's label
child_log = logging.getLogger("orchestrator.child")

CONTEXT = multiprocess.get_context("spawn")

_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


# -- starting ----------------------------------------------------------------------------------


def spawn(
    entry: str,
    args: Sequence,
    *,
    name: str,
    die_with_parent: bool = True,
    method: str = "spawn",
    env: dict[str, str] | None = None,
    wait_for_server: bool = True,
):
    """Start ``entry`` (``"module:function"``) in a fresh spawned interpreter, called with ``args``.

    The parent imports nothing of ``entry``: the child imports it. Returns the started process.
    ``method="forkserver"``: fork it from the fork server started for ``env`` (the environment the
    child will apply, :class:`ForkServer`); a plain spawn when no server can serve that environment, or
    when it is still importing and not ``wait_for_server``.
    """
    if method == "forkserver":
        proc = FORK_SERVER.start(entry, tuple(args), name, die_with_parent, env or {}, wait_for_server)
        if proc is not None:
            return proc
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


def _bootstrap(
    entry: str,
    args: tuple,
    parent_pid: int | None,
    owner_pid: int | None = None,
    environ: dict[str, str] | None = None,
) -> None:
    """Spawn target (runs in the child only). ``parent_pid``: the process it dies with (its parent: this
    project's process, or the fork server); ``owner_pid``: a forked child's, the process that asked for it,
    which it watches as well; ``environ``: a forked child's, the asking process's environment as it is now
    (a spawned child inherits it; a forked one would have the server's)."""
    from importlib import import_module

    if (
        environ is not None
    ):  # over the server's: what libraries set on import stays (PYANNOTE_METRICS_ENABLED)
        os.environ.update(environ)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C for all its children
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if owner_pid is not None:
        _watch_parent(owner_pid)
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


def _watch_parent(pid: int) -> None:
    """Linux: SIGKILL this process when ``pid`` (not its parent) ends, as ``PR_SET_PDEATHSIG`` does for a
    parent: a thread waits on the process's pidfd. A child forked from the fork server has the server for
    its parent; the server outlives the process that asked for the child while any child of it lives."""
    if not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(int(ExitCode.INTERRUPTED))

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="watch-parent", daemon=True).start()


class ForkServer:
    """The one fork server of this process (``multiprocess``'s forkserver context), started for one child
    environment.

    The server is a fresh interpreter that imports ``preload`` (by default ``stages.runtime.preload``: every
    stage's libraries, no model, no CUDA) with the child environment applied, since some libraries read
    theirs once, on import (``HF_HUB_OFFLINE``). A child asked for with another environment is spawned
    instead (None from :meth:`start`). A server that died (killed, crashed) is started again for the next
    child; a child it forked dies with it (``PR_SET_PDEATHSIG``) and is reported killed by SIGKILL
    (:func:`exit_status`), so the stage is retried.
    """

    def __init__(self, preload: Sequence[str] = ("stages.runtime.preload",)) -> None:
        self.preload = list(preload)
        self.context = multiprocess.get_context("forkserver")
        self.env: dict[str, str] | None = None
        #: set once the server has imported and forked its first child
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def ensure_running(self, env: dict[str, str]) -> bool:
        """Start the server for ``env`` unless it runs (returns at once: it imports in the background).
        False when it runs for another environment. Variables that name one run's files (the performance
        log) do not count: no library reads them on import, and each child applies its request's."""
        env = {key: value for key, value in env.items() if not key.startswith(RUN_ONLY_ENV)}
        with self._lock:
            if self.env is not None and self.env != env and self.pid is not None:
                return False
            server = _forkserver._forkserver
            if server._forkserver_pid is not None and not _gone(server._forkserver_pid):
                return True
            self.ready.clear()
            self.context.set_forkserver_preload(self.preload)
            # the server inherits this process's environment and signal mask when it starts: the child
            # environment for its imports, and SIGINT blocked (it ignores Ctrl-C; its children start with it
            # blocked until ``_bootstrap`` ignores it, as a spawned child does)
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            saved = {key: os.environ.get(key) for key in env}
            try:
                os.environ.update(env)
                server.ensure_running()
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            self.env = dict(env)
            threading.Thread(target=self._probe, name="forkserver-ready", daemon=True).start()
            return True

    def _probe(self) -> None:
        """Fork a child that does nothing: it is forked once the server has imported (then ``ready``)."""
        try:
            proc = self.context.Process(target=os.getpid, name="forkserver-ready", daemon=True)
            proc.start()
            proc.join()
        except (OSError, EOFError) as exc:
            log.warning("the fork server did not start: %s", exc)
            return
        self.ready.set()

    @property
    def pid(self) -> int | None:
        """The server's pid (None: not started)."""
        return _forkserver._forkserver._forkserver_pid

    def start(
        self,
        entry: str,
        args: tuple,
        name: str,
        die_with_parent: bool,
        env: dict[str, str],
        wait: bool = True,
    ):
        """Fork a child from the server (started for ``env`` first); None when it serves another environment,
        is still importing and not ``wait``, or cannot be reached twice (then the caller spawns)."""
        for _ in range(2):
            if not self.ensure_running(env):
                log.info("%s: the fork server runs for another environment; spawning", name)
                return None
            if not wait and not self.ready.is_set():
                return None
            owner = os.getpid() if die_with_parent else None
            proc = self.context.Process(
                target=_bootstrap,
                args=(entry, args, self.pid, owner, dict(os.environ)),
                name=name,
                daemon=True,
            )
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                proc.start()
                proc._server_pid = self.pid  # what exit_status asks after
                return proc
            except (OSError, EOFError) as exc:  # the server died meanwhile: started again next round
                log.warning("%s: the fork server did not answer (%s); starting it again", name, exc)
                if self.pid is not None:  # a killed server takes a moment to go (its memory)
                    _gone(self.pid, within_s=10.0)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return None

    def stop(self) -> None:
        """Stop the server (its children die with it); the next child starts a new one."""
        with self._lock:
            if self.pid is not None:
                _forkserver._forkserver._stop()
            self.env = None
            self.ready.clear()


#: environment variables that name one run's files, not part of the fork server's environment
RUN_ONLY_ENV = ("PIPELINE_PERF",)

FORK_SERVER = ForkServer()


def exit_status(proc) -> int | None:
    """``proc.exitcode``, except that a forked child whose fork server died reads as killed by SIGKILL (what
    happens to it: it dies with the server), not as the 255 ``multiprocess`` reports when the server cannot
    say. The child is gone when this returns (killed here if need be), so a retry never runs beside it."""
    code = proc.exitcode
    if code == 255 and getattr(proc, "_server_pid", None) is not None:
        if not _gone(proc.pid, within_s=10.0):  # PR_SET_PDEATHSIG comes once the server has fully exited
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _gone(proc.pid, within_s=5.0)
        return -int(signal.SIGKILL)
    return code


def _gone(pid: int, within_s: float = 0.0) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie not yet reaped), waiting up to ``within_s`` for it."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


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
