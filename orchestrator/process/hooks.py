"""What the parent does around every stage child: a list of hooks, in the spirit of dramatiq's middleware.

The executor calls each hook's ``before`` in order (a hook may refuse the start),
``started`` once the child runs, and ``exited`` in reverse order after it ended,
with the request object, the exit and the validated result (nothing is read
back from disk here). The default list (:func:`default_hooks`):

- :class:`PerfLogHook`: performance-log events (stage start, retry, NVML
  samples, GPU check, stage end with throughput);
- :class:`GpuGuardHook`: NVML checks before start (other processes, free
  memory: may refuse), peaks while it runs, the 0 MiB / baseline proof after;
- :class:`PidFileHook`: the child is recorded with its start time while it
  runs, so ``pipeline gpu --cleanup`` finds it if this process crashes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts import StageRequest, StageResult
from contracts.errors import GpuMemoryError
from contracts.perf import PERF_LOG_ENV
from contracts.report import Attempt, ChildTimeline
from orchestrator.gpu.guard import GpuMonitor, GpuWatch, StageGpuCheck
from orchestrator.gpu.nvml import GpuDevice, visible_devices
from orchestrator.process.outcome import Outcome
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import gpu_need_mib
from orchestrator.settings import Settings
from orchestrator.telemetry.perf_log import PerfLog

log = logging.getLogger(__name__)


@dataclass
class ChildRun:
    """One stage child as the hooks see it; filled in as it goes."""

    request: StageRequest
    request_path: Path
    pid: int | None = None
    #: why the child was not started (a hook refused), if so
    refused: str | None = None
    outcome: Outcome | None = None
    signal: int | None = None
    wall_s: float = 0.0
    result: StageResult | None = None
    #: what NVML saw of the child (set by the GPU guard)
    gpu: StageGpuCheck | None = None
    #: the GPU guard's state while the child runs
    gpu_watch: GpuWatch | None = None
    #: the Ray node the child runs on (None: this machine, no cluster)
    node: str | None = None
    #: the parent's moments of the child (seconds since the epoch): started, request written, seen to end
    spawned: float | None = None
    handed: float | None = None
    exited: float | None = None

    @property
    def stage(self) -> str:
        return self.request.stage

    def record(self) -> Attempt:
        """The child's telemetry record (run report and performance log alike)."""
        request, result, check = self.request, self.result, self.gpu
        fields: dict = {}
        if result is not None:
            ok = sum(i.ok for i in result.items)
            gpu_points = [
                c.allocated_pct for c in result.checkpoints if c.kind == "gpu" and c.allocated_pct is not None
            ]
            fields |= {
                "ok": ok,
                "failed": len(result.items) - ok,
                "items_per_s": ok / result.compute_s if result.compute_s > 0 else None,
                "import_s": result.import_s,
                "load_s": result.load_s,
                "compute_s": result.compute_s,
                "model_s": result.model_s,
                "audio_s": result.audio_s,
                "compute_cpu": result.compute_cpu,
                "model": result.model,
                "device": result.device,
                "peak_rss_mb": result.peak_rss_mb,
                "peak_vram_mb": result.peak_vram_mb,
                "max_allocated_pct": max(gpu_points, default=None),
            }
        if check is not None:  # NVML's view of the child
            fields |= {
                "gpu_process_peak_mib": check.process_peak_mib,
                "gpu_tree_after_mib": check.tree_after_mib,
                "gpu_leak": check.leak,
            }
        if self.spawned is not None or (result is not None and result.timeline is not None):
            child_side = result.timeline.model_dump() if result is not None and result.timeline else {}
            parent_side = {"spawned": self.spawned, "handed": self.handed, "exited": self.exited}
            fields["timeline"] = ChildTimeline(**(child_side | parent_side))
        outcome = self.outcome.value if self.outcome is not None else Outcome.ERROR.value
        return Attempt(
            stage=self.stage,
            attempt=request.attempt,
            batch_size=request.batch_size,
            items=len(request.items),
            outcome=outcome,
            signal=self.signal,
            wall_s=self.wall_s,
            pid=self.pid,
            node=self.node,
            **fields,
        )


class ChildHook(Protocol):
    def before(self, child: ChildRun) -> str | None:
        """Before the start; return a reason to refuse it (its items fail with it), else None."""

    def started(self, child: ChildRun) -> None:
        """The child runs (``child.pid`` is set)."""

    def exited(self, child: ChildRun) -> None:
        """The child ended, or was refused (``child.outcome`` and ``child.result`` are set)."""


class PidFileHook:
    def __init__(self, registry: ChildRegistry | None = None) -> None:
        self.registry = registry if registry is not None else ChildRegistry()

    def before(self, child: ChildRun) -> None:
        return None

    def started(self, child: ChildRun) -> None:
        self.registry.add(child.pid, child.stage, child.request_path)

    def exited(self, child: ChildRun) -> None:
        if child.pid is not None:
            self.registry.remove(child.pid)


class GpuGuardHook:
    def __init__(
        self, monitor: GpuMonitor, on_sample: Callable[[ChildRun, GpuDevice, float], None] | None = None
    ) -> None:
        self.monitor = monitor
        #: called with (child, device, MiB the child holds) for each NVML sample (the performance log listens)
        self.on_sample = on_sample

    def before(self, child: ChildRun) -> str | None:
        request = child.request
        try:
            child.gpu_watch = self.monitor.before(
                child.stage,
                request.device,
                visible_devices(request.env),
                gpu_need_mib(child.stage, request.settings),
            )
        except GpuMemoryError as exc:
            log.error("%s: not started: %s", child.stage, exc)
            return str(exc)
        return None

    def started(self, child: ChildRun) -> None:
        on_sample = None
        if self.on_sample is not None:

            def on_sample(watch, dev, held):
                return self.on_sample(child, dev, held)

        self.monitor.started(child.gpu_watch, child.pid, on_sample=on_sample)

    def exited(self, child: ChildRun) -> None:
        child.gpu = self.monitor.after(child.gpu_watch)


class PerfLogHook:
    """Performance-log events for each child; the log's path is in the request's environment."""

    def __init__(self) -> None:
        #: stage -> (outcome, batch size) of its previous child, for the retry event
        self._last: dict[str, tuple[str, int]] = {}

    @staticmethod
    def _log(child: ChildRun) -> PerfLog:
        return PerfLog(child.request.env.get(PERF_LOG_ENV))

    def before(self, child: ChildRun) -> None:
        request, perf = child.request, self._log(child)
        previous = self._last.get(child.stage)
        if request.attempt > 1 and previous is not None:
            perf.emit(
                "retry",
                stage=child.stage,
                attempt=request.attempt,
                batch_size=request.batch_size,
                items=len(request.items),
                previous_outcome=previous[0],
                previous_batch_size=previous[1],
            )
        perf.emit(
            "stage_start",
            stage=child.stage,
            attempt=request.attempt,
            batch_size=request.batch_size,
            items=len(request.items),
            device=request.device,
        )
        return None

    def started(self, child: ChildRun) -> None:
        pass

    def sampled(self, child: ChildRun, dev: GpuDevice, held: float) -> None:
        self._log(child).emit(
            "gpu_sample",
            stage=child.stage,
            attempt=child.request.attempt,
            pid=child.pid,
            gpu_index=dev.index,
            device_used_mib=dev.used_mib,
            device_total_mib=dev.total_mib,
            process_mib=held,
        )

    def exited(self, child: ChildRun) -> None:
        request, check, perf = child.request, child.gpu, self._log(child)
        if check is not None:
            perf.emit(
                "gpu_check",
                stage=child.stage,
                attempt=request.attempt,
                pid=child.pid,
                gpu_index=check.index,
                device_used_mib=check.after_used_mib,
                baseline_used_mib=check.baseline_used_mib,
                process_mib=check.tree_after_mib,
                leak=check.leak,
            )
        record = child.record()
        perf.emit(
            "stage_end",
            stage=child.stage,
            attempt=request.attempt,
            pid=child.pid,
            gpu_index=check.index if check is not None else None,
            record=record,
        )
        self._last[child.stage] = (record.outcome, request.batch_size)


def default_hooks(
    settings: Settings | None = None,
    *,
    registry: ChildRegistry | None = None,
    monitor: GpuMonitor | None = None,
) -> list[ChildHook]:
    """The hooks every stage child gets, as ``settings`` describe them (None: the defaults, no environment
    read): performance log, GPU guard (unless ``gpu_monitor`` is off), pid files. ``registry`` /
    ``monitor`` replace the ones the settings describe (tests)."""
    settings = settings if settings is not None else Settings.model_construct()
    perf = PerfLogHook()
    hooks: list[ChildHook] = [perf]
    if monitor is None and settings.gpu_monitor:
        monitor = GpuMonitor(
            tolerance_mib=settings.gpu_leak_tolerance_mib,
            sample_s=settings.gpu_sample_s or None,
            check_free=settings.gpu_check_free,
        )
    if monitor is not None:
        hooks.append(GpuGuardHook(monitor, on_sample=perf.sampled))
    hooks.append(PidFileHook(registry if registry is not None else ChildRegistry(settings.pid_dir)))
    return hooks
