"""``OUT/performance_logs/<run>.jsonl``: one JSON event per line for every run.

Children append their memory checkpoints (the path reaches them as
``PIPELINE_PERF_LOG`` in ``StageRequest.env``); the parent appends run start,
stage start/end with throughput, retries, NVML samples and leak checks. The
records are :data:`contracts.perf.PerfEvent`; ``pipeline report`` reads them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from contracts.perf import PERF_LOG_ENV, append_event, perf_event
from orchestrator import layout

log = logging.getLogger(__name__)

DIRECTORY = layout.PERF_LOGS


def perf_log_path(output_dir: str | Path, run_id: str) -> Path:
    return Path(output_dir) / DIRECTORY / f"{run_id}.jsonl"


def child_env(output_dir: str | Path, run_id: str) -> dict[str, str]:
    """What children need to append to this run's performance log (merged into ``Settings.child_env()``)."""
    return {PERF_LOG_ENV: str(perf_log_path(output_dir, run_id).absolute())}


class PerfLog:
    """The parent's writer; a failure to write is logged once and never stops a run."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._failed = False

    def emit(self, event: str, **fields) -> None:
        if self.path is None or self._failed:
            return
        try:
            append_event(self.path, perf_event(t=time.time(), event=event, **fields))
        except OSError as exc:
            self._failed = True
            log.warning("cannot append to performance log %s: %s", self.path, exc)
