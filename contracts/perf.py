"""Memory checkpoints and performance-log events (``performance_logs/<run>.jsonl``).

Children and the parent append :class:`PerfEvent` lines to the same file: the
child its memory checkpoints as they happen (so they survive a child killed
mid-stage), the parent stage start/end, GPU samples, retries and leak checks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from contracts.artifacts import Strict

#: the name in ``StageRequest.env`` through which children learn the run's performance log (JSON lines)
PERF_LOG_ENV = "PIPELINE_PERF_LOG"

EventKind = Literal["run_start", "stage_start", "checkpoint", "gpu_sample", "stage_end", "retry", "gpu_check"]


class MemoryCheckpoint(Strict):
    """Memory at one named point of a stage child, in MiB.

    ``kind="gpu"``: torch's allocator on the child's CUDA device (allocated,
    reserved) and the device's free / total memory. ``kind="cpu"``: the
    process's resident set size and its peak (a CPU run has no VRAM).
    """

    point: str
    #: seconds since the epoch, comparable across processes
    t: float
    kind: Literal["gpu", "cpu"]
    allocated_mb: float | None = None
    reserved_mb: float | None = None
    free_mb: float | None = None
    total_mb: float | None = None
    rss_mb: float | None = None
    peak_rss_mb: float | None = None

    @property
    def allocated_pct(self) -> float | None:
        if self.allocated_mb is None or not self.total_mb:
            return None
        return 100.0 * self.allocated_mb / self.total_mb


class PerfEvent(Strict):
    """One line of the performance log; fields that do not apply stay unset."""

    t: float
    event: EventKind
    stage: str | None = None
    attempt: int | None = Field(default=None, ge=1)
    pid: int | None = None
    # checkpoint
    point: str | None = None
    kind: Literal["gpu", "cpu"] | None = None
    allocated_mb: float | None = None
    reserved_mb: float | None = None
    free_mb: float | None = None
    total_mb: float | None = None
    rss_mb: float | None = None
    peak_rss_mb: float | None = None
    # stage start / end, retry
    device: str | None = None
    batch_size: int | None = None
    items: int | None = None
    ok: int | None = None
    failed: int | None = None
    outcome: str | None = None
    wall_s: float | None = None
    compute_s: float | None = None
    items_per_s: float | None = None
    peak_vram_mb: float | None = None
    previous_outcome: str | None = None
    previous_batch_size: int | None = None
    # gpu sample / gpu check (NVML, parent's view)
    gpu_index: int | None = None
    device_used_mib: float | None = None
    #: gpu_check: device usage before the child started
    baseline_used_mib: float | None = None
    device_total_mib: float | None = None
    process_mib: float | None = None
    process_peak_mib: float | None = None
    leak: str | None = None

    @classmethod
    def of_checkpoint(cls, checkpoint: MemoryCheckpoint, stage: str, attempt: int, pid: int) -> PerfEvent:
        return cls(event="checkpoint", stage=stage, attempt=attempt, pid=pid, **checkpoint.model_dump())


def append_event(path: str | Path, event: PerfEvent) -> None:
    """Append ``event`` as one JSON line with a single ``write`` (O_APPEND), so writers never interleave."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (event.model_dump_json(exclude_none=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_events(path: str | Path) -> list[PerfEvent]:
    """Every valid event of a performance log; a torn last line (a killed writer) is skipped."""
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(PerfEvent.model_validate_json(line))
            except ValueError:
                continue
    return events
