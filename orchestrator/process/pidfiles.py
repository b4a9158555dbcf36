"""Pid files of running stage children, and cleanup of the ones a crashed run left behind.

The executor writes ``<pid_dir>/<pid>.json`` when it starts a child and removes
it when the child exits. Each record holds the child's and its parent's start
times (psutil ``create_time``), so a recycled pid is never taken for ours, and
nothing is ever matched by process name. A child is an *orphan* when it is
still running (same pid, same start time) but the pipeline process that
started it is gone; only orphans are stopped.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from contracts.io import atomic_write_text
from orchestrator.process.toolkit import stop_tree

log = logging.getLogger(__name__)

#: start times are compared with this slack (seconds): psutil derives them from clock ticks
_SAME_START_S = 0.05


def default_pid_dir() -> Path:
    """Per-user directory for the pid files.

    ``$XDG_RUNTIME_DIR/isostage/children``, else ``/tmp/isostage-<uid>/children``.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "isostage" if runtime else Path(tempfile.gettempdir()) / f"isostage-{os.getuid()}"
    return base / "children"


@dataclass(frozen=True)
class ChildRecord:
    pid: int
    create_time: float
    stage: str
    parent_pid: int
    parent_create_time: float
    request: str
    started_at: float

    def child_alive(self) -> bool:
        return _alive(self.pid, self.create_time)

    def parent_alive(self) -> bool:
        return _alive(self.parent_pid, self.parent_create_time)

    def describe(self) -> str:
        return f"pid {self.pid} ({self.stage} stage child of pipeline pid {self.parent_pid}, request {self.request})"


def _alive(pid: int, create_time: float) -> bool:
    """True when ``pid`` runs and is the same process that started at ``create_time`` (zombies are not alive)."""
    try:
        proc = psutil.Process(pid)
        return (
            abs(proc.create_time() - create_time) <= _SAME_START_S and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


@dataclass
class Cleanup:
    """What ``ChildRegistry.cleanup`` did."""

    stopped: list[ChildRecord] = field(default_factory=list)
    #: still owned by a running pipeline: left alone
    running: list[ChildRecord] = field(default_factory=list)
    #: records of children that had already exited (or whose pid now belongs to another process): removed
    stale: list[ChildRecord] = field(default_factory=list)
    #: orphans that could not be stopped (e.g. another user's): (record, reason)
    failed: list[tuple[ChildRecord, str]] = field(default_factory=list)


class ChildRegistry:
    """One pid file per running stage child in ``directory``."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_pid_dir()

    def _path(self, pid: int) -> Path:
        return self.directory / f"{pid}.json"

    def add(self, pid: int, stage: str, request: str | Path) -> ChildRecord | None:
        """Record a child just started (None when it already exited and cannot be described)."""
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            return None
        me = psutil.Process()
        record = ChildRecord(
            pid=pid,
            create_time=create_time,
            stage=stage,
            parent_pid=me.pid,
            parent_create_time=me.create_time(),
            request=str(request),
            started_at=time.time(),
        )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self._path(pid), json.dumps(asdict(record)))
        except OSError as exc:
            log.warning("cannot write the pid file of %s child %d in %s: %s", stage, pid, self.directory, exc)
            return None
        return record

    def remove(self, pid: int) -> None:
        try:
            self._path(pid).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove pid file %s: %s", self._path(pid), exc)

    def records(self) -> list[ChildRecord]:
        found = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                found.append(ChildRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("ignoring unreadable pid file %s: %s", path, exc)
        return found

    def orphans(self) -> list[ChildRecord]:
        return [r for r in self.records() if r.child_alive() and not r.parent_alive()]

    def cleanup(self, grace_s: float = 5.0) -> Cleanup:
        """Stop orphaned children (SIGTERM, then SIGKILL after ``grace_s``) and drop stale records."""
        done = Cleanup()
        for record in self.records():
            if not record.child_alive():
                done.stale.append(record)
                self.remove(record.pid)
            elif record.parent_alive():
                done.running.append(record)
            else:
                error = stop_tree(record.pid, grace_s)
                if error is None:
                    done.stopped.append(record)
                    self.remove(record.pid)
                    log.warning("stopped orphaned stage child %s", record.describe())
                else:
                    done.failed.append((record, error))
        return done
