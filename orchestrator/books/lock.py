"""One run per output directory: a lock the kernel releases when its holder dies.

``OUT/.lock`` is locked with ``fcntl.flock`` for the whole run and holds the
holder's pid, host and start time. A second run on the same output directory
gets :class:`~contracts.errors.OutputBusyError` (exit 2) naming the holder, or
waits for it (``--wait``). The lock belongs to the open file, so a holder killed
with SIGKILL never leaves a stale lock behind: the file may stay, the lock does not.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from contracts.errors import OutputBusyError, SettingsError
from orchestrator import layout

log = logging.getLogger(__name__)

LOCK_NAME = layout.LOCK


class OutputLock:
    """``what`` names the folder in errors, ``advice`` says what to do when it is held, ``role`` says in the
    lock file what holds it (the server's state folder uses the same lock: ``orchestrator.api.jobs``).
    ``existing``: the folder must already be an output folder (``layout.is_output``: a run made it), as
    for the commands that rewrite its products; anything else is refused before a file is written."""

    def __init__(
        self,
        directory: Path,
        wait: bool = False,
        what: str = "output directory",
        advice: str = "wait for it (--wait) or choose another --output",
        role: str = "pipeline",
        existing: bool = False,
    ) -> None:
        self.path = Path(directory) / LOCK_NAME
        self.wait = wait
        self.existing = existing
        self.what, self.advice, self.role = what, advice, role
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        if self.existing and not layout.is_output(self.path.parent):
            raise SettingsError(
                f"{self.path.parent} is not an output folder (no {layout.RUNS}/ or {layout.IDS} of a run): "
                "nothing written; give the --output folder of a `pipeline process` run"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # read-only, not a directory, no permission: nothing could be written there
            raise SettingsError(
                f"cannot write to {self.what} {self.path.parent}: {exc.strerror or exc}"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if not self.wait:
                    raise OutputBusyError(
                        f"{self.what} {self.path.parent} is in use by {holder}: {self.advice}"
                    ) from None
                log.warning("%s %s is in use by %s: waiting for it", self.what, self.path.parent, holder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "role": self.role,
                "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except OSError as exc:  # e.g. a full disk: the run cannot start (exit 2, with the reason)
            os.close(fd)
            if isinstance(exc, BlockingIOError):
                raise
            raise SettingsError(
                f"cannot write to {self.what} {self.path.parent}: {exc.strerror or exc} "
                f"(writing {self.path.name})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock (the file stays: the next holder rewrites it)
            self._fd = None


def _holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (
            f"{record.get('role', 'pipeline')} pid {record['pid']} on {record['host']} "
            f"(started {record['started_at']})"
        )
    except (ValueError, KeyError, OSError):
        return "another pipeline run"
