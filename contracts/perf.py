"""Memory checkpoints and performance-log events (``performance_logs/<run>.jsonl``).

Children and the parent append :data:`PerfEvent` lines to the same file: the
child its memory checkpoints as they happen (so they survive a child killed
mid-stage), the parent stage start/end, GPU samples, retries and leak checks.
A line is one of the event models below, told apart by its ``event`` field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

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


class _Event(Strict):
    """What every line of the performance log carries; ``event`` says which kind of line it is."""

    #: seconds since the epoch, comparable across processes
    t: float
    event: EventKind
    stage: str | None = None
    attempt: int | None = Field(default=None, ge=1)
    pid: int | None = None


class RunStartEvent(_Event):
    event: Literal["run_start"] = "run_start"


class StageStartEvent(_Event):
    """The parent starts a stage child."""

    event: Literal["stage_start"] = "stage_start"
    device: str | None = None
    batch_size: int | None = None
    items: int | None = None


class CheckpointEvent(MemoryCheckpoint, _Event):
    """A stage child's memory checkpoint (:class:`MemoryCheckpoint`'s fields), appended as it is taken."""

    event: Literal["checkpoint"] = "checkpoint"

    @classmethod
    def of_checkpoint(
        cls, checkpoint: MemoryCheckpoint, stage: str, attempt: int, pid: int
    ) -> CheckpointEvent:
        return cls(stage=stage, attempt=attempt, pid=pid, **checkpoint.model_dump())


class RetryEvent(_Event):
    """The parent respawns a stage child (after an out-of-memory, a crash): with what, and why."""

    event: Literal["retry"] = "retry"
    batch_size: int | None = None
    items: int | None = None
    previous_outcome: str | None = None
    previous_batch_size: int | None = None


class StageEndEvent(_Event):
    """A stage child ended: its record, the same one the run report keeps."""

    event: Literal["stage_end"] = "stage_end"
    record: Attempt | None = None
    gpu_index: int | None = None


class GpuSampleEvent(_Event):
    """The parent's NVML view of the GPU while a child runs."""

    event: Literal["gpu_sample"] = "gpu_sample"
    gpu_index: int | None = None
    device_used_mib: float | None = None
    device_total_mib: float | None = None
    #: what the child's process tree holds on the device
    process_mib: float | None = None


class GpuCheckEvent(_Event):
    """The parent's NVML check of the GPU after a child exited: back to the baseline, or a leak."""

    event: Literal["gpu_check"] = "gpu_check"
    gpu_index: int | None = None
    device_used_mib: float | None = None
    #: device usage before the child started
    baseline_used_mib: float | None = None
    device_total_mib: float | None = None
    process_mib: float | None = None
    leak: str | None = None


#: one line of the performance log, of the kind its ``event`` names
PerfEvent = Annotated[
    RunStartEvent
    | StageStartEvent
    | CheckpointEvent
    | RetryEvent
    | StageEndEvent
    | GpuSampleEvent
    | GpuCheckEvent,
    Field(discriminator="event"),
]
PERF_EVENT: TypeAdapter[PerfEvent] = TypeAdapter(PerfEvent)


def perf_event(**fields) -> PerfEvent:
    """The event of the kind ``fields["event"]`` names, validated (ValidationError: unknown kind or field)."""
    return PERF_EVENT.validate_python(fields)


def append_event(path: str | Path, event: PerfEvent) -> None:
    """Append ``event`` as one line of the performance log (a single O_APPEND write: writers never interleave)."""
    append_line(path, event, exclude_none=True)


def read_events(path: str | Path) -> list[PerfEvent]:
    """Every valid event of a performance log; a torn last line (a killed writer) is skipped."""
    return read_lines(path, PERF_EVENT)
