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
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)

JOURNAL_NAME = "journal.jsonl"


class Journal:
    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, item: str, stage: str, status: str, **extra) -> None:
        event = {"time": datetime.now(timezone.utc).isoformat(), "run": self.run_id, "item": item,
                 "stage": stage, "status": status, **extra}
        line = json.dumps(event, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def events(self) -> list[dict]:
        """Every readable event (a line cut short by a crash is skipped)."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                log.debug("skipping a cut-short journal line in %s", self.path)
        return events

    def completed(self) -> dict[str, str]:
        """item id -> fingerprint of its last completed run (stage "outputs", status "ok")."""
        return {e["item"]: e.get("fingerprint", "") for e in self.events()
                if e.get("stage") == "outputs" and e.get("status") == "ok"}
