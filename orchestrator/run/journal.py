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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contracts.jsonl import append_line, iter_lines, read_lines, repair_tail
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
        """item id -> its last completed run (stage "outputs", status "ok"): the outputs fingerprint, and the
        event's line, parsed only when it is used (:meth:`Completed.event`): 100,000 parsed events would
        take gigabytes, their lines a tenth of that."""
        done: dict[str, Completed] = {}
        for line in iter_lines(self.path):
            if '"outputs"' not in line or '"ok"' not in line:
                continue
            item, fingerprint = line_field(line, "item"), line_field(line, "fingerprint")
            if item is not None and (line_field(line, "stage"), line_field(line, "status")) != (
                "outputs",
                "ok",
            ):
                continue
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
            if isinstance(item, str):
                done[item] = Completed(fingerprint if isinstance(fingerprint, str) else "", line)
        return done


@dataclass(frozen=True)
class Completed:
    """An input's last completed run, as the journal holds it."""

    fingerprint: str
    line: str

    def event(self) -> dict:
        """The whole event ({} if its line does not parse: it is then checked the full way)."""
        try:
            event = json.loads(self.line)
        except ValueError:
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
