"""Memory checkpoints and performance-log events (``performance_logs/<run>.jsonl``).

Children and the parent append :class:`PerfEvent` lines to the same file: the
child its memory checkpoints as they happen (so they survive a child killed
mid-stage), the parent stage start/end, GPU samples, retries and leak checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from contracts.artifacts import Strict
from contracts.jsonl import append_line, read_lines
from contracts.report import Attempt

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
    # stage start, retry
    device: str | None = None
    batch_size: int | None = None
    items: int | None = None
    previous_outcome: str | None = None
    # stage end: the child's record, the same one the run report keeps
    record: Attempt | None = None
    previous_batch_size: int | None = None
    # gpu sample / gpu check (NVML, parent's view)
    gpu_index: int | None = None
    device_used_mib: float | None = None
    #: gpu_check: device usage before the child started
    baseline_used_mib: float | None = None
    device_total_mib: float | None = None
    process_mib: float | None = None
    leak: str | None = None

    @classmethod
    def of_checkpoint(cls, checkpoint: MemoryCheckpoint, stage: str, attempt: int, pid: int) -> PerfEvent:
        return cls(event="checkpoint", stage=stage, attempt=attempt, pid=pid, **checkpoint.model_dump())


def append_event(path: str | Path, event: PerfEvent) -> None:
    """Append ``event`` as one line of the performance log (a single O_APPEND write: writers never interleave)."""
    append_line(path, event, exclude_none=True)


def read_events(path: str | Path) -> list[PerfEvent]:
    """Every valid event of a performance log; a torn last line (a killed writer) is skipped."""
    return read_lines(path, PerfEvent)
