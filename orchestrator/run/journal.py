"""The run directory's journal: what each input has completed, stage by stage.

An append-only JSON-lines file (``OUT/journal.jsonl``), fsynced per event, so
it survives a kill -9 or a power loss. It is the human-readable history of
every run in this output directory. Resuming does not trust it blindly: an
artifact is reused only when it validates and its fingerprint is current
(``orchestrator.run.runner.current_artifact``); the journal tells how much of a
previous run is being resumed.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from contracts.jsonl import append_line, read_lines, repair_tail

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
        event = {"time": datetime.now(timezone.utc).isoformat(), "run": self.run_id, "item": item,
                 "stage": stage, "status": status, **extra}
        append_line(self.path, event, fsync=True)

    def events(self) -> list[dict]:
        """Every readable event (a line cut short by a crash is skipped)."""
        return read_lines(self.path)

    def completed(self) -> dict[str, dict]:
        """item id -> the event of its last completed run (stage "outputs", status "ok"): its outputs
        fingerprint and, from this version on, its files and report summary."""
        return {e["item"]: e for e in self.events() if e.get("stage") == "outputs" and e.get("status") == "ok"}
