"""What the parent does around every stage child it starts (the executor's one hook).

- pid file: the child is recorded with its start time while it runs, so
  ``pipeline gpu --cleanup`` can find it if this process crashes;
- GPU: NVML checks before start (other processes, free memory), peaks while it
  runs, the 0 MiB / baseline proof after it exits (:mod:`orchestrator.gpu.nvml`);
- performance log: stage start, retry, NVML samples, stage end with
  throughput, GPU check (:mod:`orchestrator.telemetry.perf_log`).

Everything it needs is in the request file the executor is handed; the
run's performance log path is in the request's environment.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from contracts import StageRequest, StageResult, load_model
from contracts.errors import ArtifactError, GpuMemoryError
from contracts.perf import PERF_LOG_ENV
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.gpu.nvml import GpuDevice, GpuMonitor, GpuWatch, StageGpuCheck, visible_devices
from orchestrator.telemetry.perf_log import PerfLog
from orchestrator.registry import gpu_need_mib

log = logging.getLogger(__name__)


@dataclass
class Watching:
    stage: str
    request_path: Path
    request: StageRequest | None
    perf: PerfLog
    started: float
    gpu: GpuWatch | None = None
    #: why the child was not started (not enough free GPU memory), if so
    refused: str | None = None
    pid: int | None = None


class ChildWatch:
    def __init__(self, registry: ChildRegistry | None = None, monitor: GpuMonitor | None = None) -> None:
        self.registry = registry if registry is not None else ChildRegistry()
        #: None: no GPU monitoring at all
        self.monitor = monitor
        self._last: dict[str, tuple[str, int]] = {}

    @classmethod
    def from_settings(cls, settings) -> ChildWatch:
        monitor = None
        if settings.gpu_monitor:
            monitor = GpuMonitor(tolerance_mib=settings.gpu_leak_tolerance_mib, sample_s=settings.gpu_sample_s or None,
                                 check_free=settings.gpu_check_free)
        return cls(ChildRegistry(settings.pid_dir), monitor)

    @classmethod
    def default(cls) -> ChildWatch:
        return cls(ChildRegistry(), GpuMonitor())

    def before(self, stage: str, request_path: Path) -> Watching:
        try:
            request = load_model(request_path, StageRequest)
        except ArtifactError:
            request = None  # the child will report the broken request itself
        perf = PerfLog(request.env.get(PERF_LOG_ENV) if request else None)
        watching = Watching(stage=stage, request_path=Path(request_path), request=request, perf=perf,
                            started=time.perf_counter())
        if request is None:
            return watching
        previous = self._last.get(stage)
        if request.attempt > 1 and previous is not None:
            perf.emit("retry", stage=stage, attempt=request.attempt, batch_size=request.batch_size,
                      items=len(request.items), previous_outcome=previous[0], previous_batch_size=previous[1])
        perf.emit("stage_start", stage=stage, attempt=request.attempt, batch_size=request.batch_size,
                  items=len(request.items), device=request.device)
        if self.monitor is not None:
            try:
                watching.gpu = self.monitor.before(stage, request.device, visible_devices(request.env),
                                                   gpu_need_mib(stage, request.settings))
            except GpuMemoryError as exc:
                watching.refused = str(exc)
                log.error("%s: not started: %s", stage, exc)
                perf.emit("stage_end", stage=stage, attempt=request.attempt, outcome="refused", wall_s=0.0,
                          batch_size=request.batch_size, items=len(request.items))
                self._last[stage] = ("refused", request.batch_size)
        return watching

    def started(self, watching: Watching, pid: int) -> None:
        watching.pid = pid
        self.registry.add(pid, watching.stage, watching.request_path)
        if self.monitor is not None:
            self.monitor.started(watching.gpu, pid, on_sample=lambda w, dev, held: self._sampled(watching, dev, held))

    def _sampled(self, watching: Watching, dev: GpuDevice, held: float) -> None:
        watching.perf.emit("gpu_sample", stage=watching.stage, attempt=_attempt(watching), pid=watching.pid,
                           gpu_index=dev.index, device_used_mib=dev.used_mib, device_total_mib=dev.total_mib,
                           process_mib=held)

    def exited(self, watching: Watching, outcome: str, wall_s: float) -> StageGpuCheck | None:
        """Drop the pid file, check the GPU, log the stage's end; returns what the GPU check saw."""
        if watching.pid is not None:
            self.registry.remove(watching.pid)
        check = self.monitor.after(watching.gpu) if self.monitor is not None else None
        request = watching.request
        if request is None:
            return check
        result = _result(request)
        fields: dict = {"batch_size": request.batch_size, "items": len(request.items)}
        if result is not None:
            ok = sum(i.ok for i in result.items)
            fields |= {"ok": ok, "failed": len(result.items) - ok, "compute_s": result.compute_s,
                       "items_per_s": ok / result.compute_s if result.compute_s > 0 else None,
                       "peak_vram_mb": result.peak_vram_mb, "peak_rss_mb": result.peak_rss_mb,
                       "device": result.device}
        if check is not None:
            fields |= {"gpu_index": check.index, "process_peak_mib": check.process_peak_mib}
            watching.perf.emit("gpu_check", stage=watching.stage, attempt=request.attempt, pid=watching.pid,
                               gpu_index=check.index, device_used_mib=check.after_used_mib,
                               baseline_used_mib=check.baseline_used_mib,
                               process_mib=check.tree_after_mib, leak=check.leak)
        watching.perf.emit("stage_end", stage=watching.stage, attempt=request.attempt, pid=watching.pid,
                           outcome=outcome, wall_s=wall_s, **fields)
        self._last[watching.stage] = (outcome, request.batch_size)
        return check


def _attempt(watching: Watching) -> int | None:
    return watching.request.attempt if watching.request else None


def _result(request: StageRequest) -> StageResult | None:
    path = Path(request.result_path)
    if not path.exists():
        return None
    try:
        result = load_model(path, StageResult)
    except ArtifactError:
        return None
    return result if result.request_id == request.request_id else None
