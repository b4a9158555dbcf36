"""The run directory's journal: what each input has completed, stage by stage.

An append-only JSON-lines file (``OUT/journal.jsonl``), fsynced per event, so
it survives a kill -9 or a power loss. It is the human-readable history of
every run in this output directory. Resuming does not trust it blindly: an
artifact is reused only when it validates and its fingerprint is current
(``orchestrator.run.runner.current_artifact``); the journal tells how much of a
previous run is being resumed.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contracts.jsonl import append_line, iter_lines_at, read_lines, repair_tail
from orchestrator import layout

JOURNAL_NAME = layout.JOURNAL


class Journal:
    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        #: a torn last line (a run killed mid-write) is ended before this run's first append
        self._repaired = False

    def record(self, item: str, stage: str, status: str, **extra) -> None:
        if not self._repaired:
            repair_tail(self.path)
            self._repaired = True
        event = {
            "time": datetime.now(UTC).isoformat(),
            "run": self.run_id,
            "item": item,
            "stage": stage,
            "status": status,
            **extra,
        }
        append_line(self.path, event, fsync=True)

    def events(self) -> list[dict]:
        """Every readable event (a line cut short by a crash is skipped)."""
        return read_lines(self.path)

    def completed(self) -> dict[str, Completed]:
        """item id -> its last completed run (stage "outputs", status "ok"): the outputs fingerprint, the
        transcript's language, and where the event's line is in the file, read and parsed only when it is used
        (:meth:`Completed.event`): 100,000 parsed events would take gigabytes, their lines 170 MB, their
        places a tenth of that."""
        done: dict[str, Completed] = {}
        lines = _Lines(self.path)
        for offset, line, size in iter_lines_at(self.path):
            if '"outputs"' not in line or '"ok"' not in line:
                continue
            item, fingerprint = line_field(line, "item"), line_field(line, "fingerprint")
            if item is not None and (line_field(line, "stage"), line_field(line, "status")) != (
                "outputs",
                "ok",
            ):
                continue
            language = line_field(line, "text_language")
            if item is None:  # not the layout this writer makes: parse it whole
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if (event.get("stage"), event.get("status")) != ("outputs", "ok"):
                    continue
                item, fingerprint = event.get("item"), event.get("fingerprint")
                summary = event.get("summary")
                language = summary.get("text_language") if isinstance(summary, dict) else None
            if isinstance(item, str):
                done[item] = Completed(
                    fingerprint if isinstance(fingerprint, str) else "",
                    sys.intern(language) if isinstance(language, str) else None,
                    lines,
                    offset,
                    size,
                )
        return done


class _Lines:
    """The journal file, read back at the places :meth:`Journal.completed` found (the file is only ever
    appended to: a place stays where it was). One descriptor, closed with the last :class:`Completed`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self, offset: int, size: int) -> str:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._fd, size, offset).decode("utf-8", errors="replace").strip()

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


@dataclass(frozen=True, slots=True)
class Completed:
    """An input's last completed run, as the journal holds it: what planning reads of it, and where the
    rest is."""

    fingerprint: str
    #: the transcript's language the event's summary names (its aligner is planned from it)
    text_language: str | None
    lines: _Lines
    offset: int
    size: int

    @property
    def line(self) -> str:
        """The event's line, read from the journal again."""
        return self.lines.read(self.offset, self.size)

    def event(self) -> dict:
        """The whole event ({} if its line does not parse: it is then checked the full way)."""
        try:
            event = json.loads(self.line)
        except (OSError, ValueError):
            return {}
        ok = isinstance(event, dict) and event.get("stage") == "outputs" and event.get("status") == "ok"
        return event if ok else {}


_DECODER = json.JSONDecoder()


def line_field(line: str, name: str) -> str | None:
    """The string value of top-level key ``name`` in a line :meth:`Journal.record` wrote (``"name": "..."``,
    json.dumps' separators; keys before the value are fixed ones), without parsing the rest of the line."""
    at = line.find(f'"{name}": "')
    if at < 0:
        return None
    try:
        value, _ = _DECODER.raw_decode(line, at + len(name) + 4)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
