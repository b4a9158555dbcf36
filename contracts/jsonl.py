"""JSON-lines files: one writer and one tolerant reader for every ``.jsonl`` of a run.

Each record is appended with one ``write`` on an ``O_APPEND`` descriptor (written
again from where a short write stopped, until the whole line is written), so
processes appending to the same file (children and the parent, to the
performance log) do not interleave within a line. A writer killed mid-line
leaves a torn last line; :func:`read_lines` skips it (and any line that does
not validate), so a reader never fails on what a crash left behind, and
:func:`repair_tail` ends such a line before a new writer appends, so the torn
line never swallows the next record. A full disk is a
:class:`~contracts.errors.DiskFullError` naming the file and the bytes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, TypeAdapter

from contracts.errors import DiskFullError
from contracts.io import is_disk_full

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def append_line(
    path: str | Path, record: BaseModel | dict, *, fsync: bool = False, exclude_none: bool = False
) -> None:
    """Append ``record`` (a model, or a JSON-able dict) as one line; ``fsync``: on disk before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(record, BaseModel):
        text = record.model_dump_json(exclude_none=exclude_none)
    else:
        text = json.dumps(record, ensure_ascii=False)
    data = (text + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFullError(
                f"no space left appending to {path.name} ({len(data)} bytes; {exc.strerror}) in {path.parent}"
            ) from None
        raise


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``: ``os.write`` may write less than asked (a signal, a pipe, a nearly
    full disk), and a line cut short there would be torn although its writer lives on."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # nothing written and no error: the disk took no byte
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def repair_tail(path: str | Path) -> bool:
    """End a torn last line (a writer killed mid-line) with a newline, so that the next append starts a
    line of its own instead of joining the torn one (and being skipped with it). True if it repaired.
    For a file with one writer at a time (the journal under the run lock)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return False
        try:
            os.write(fd, b"\n")
            os.fsync(fd)
        except OSError as exc:
            if is_disk_full(exc):
                raise DiskFullError(
                    f"no space left repairing {Path(path).name} (1 byte; {exc.strerror})"
                ) from None
            raise
        log.warning(
            "%s: its last line was cut short (a writer was killed mid-line); it is ended and skipped", path
        )
        return True
    finally:
        os.close(fd)


def read_lines(path: str | Path, model: type[M] | TypeAdapter | None = None) -> list:
    """Every valid record of ``path``, as ``model`` instances (a model, or a TypeAdapter of a union of
    models), or dicts; [] when the file does not exist.

    A torn or invalid line (a writer killed mid-line) is skipped with a debug message.
    """
    if model is None:
        parse = json.loads
    else:
        parse = model.validate_json if isinstance(model, TypeAdapter) else model.model_validate_json
    records = []
    for line in iter_lines(path):
        try:
            records.append(parse(line))
        except ValueError:
            log.debug("skipping an unreadable line of %s", path)
    return records


def iter_lines(path: str | Path):
    """The non-blank lines of ``path`` (split at ``\\n`` only), one at a time: a journal of 100,000 inputs is
    never held whole. Nothing when the file does not exist."""
    for _offset, line, _size in iter_lines_at(path):
        yield line


def iter_lines_at(path: str | Path):
    """:func:`iter_lines`, each line with the byte offset and length of its raw line in the file (to read it
    back later with ``os.pread``)."""
    try:
        fh = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return
    offset = 0
    with fh:
        for raw in fh:
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                yield offset, line, len(raw)
            offset += len(raw)
