"""The guard around each stage child on its GPU (NVML only: no CUDA context in the parent).

- before: name the *other* processes holding VRAM on the child's device (PID,
  command, MiB) and refuse to start when free memory is below what the stage
  needs (:class:`contracts.errors.GpuMemoryError`);
- while it runs: sample the device's usage and the child's own usage (peaks);
- after it exits: prove that our process tree holds 0 MiB on the device and
  that device usage is back to the pre-stage baseline within a tolerance;
  otherwise log a leak error naming the stage.

The checks are pure functions of snapshots; :class:`GpuMonitor` applies them
with a :class:`~orchestrator.gpu.nvml.GpuReader`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from contracts.errors import GpuMemoryError
from contracts.units import gib
from orchestrator.gpu.nvml import GpuDevice, GpuProcess, GpuReader, GpuSnapshot, NvmlReader, nvml_index
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: the monitor's defaults are the settings' (declared once, in orchestrator.settings)
_DEFAULTS = Settings.model_fields


# -- pure checks -------------------------------------------------------------


def describe(proc: GpuProcess) -> str:
    """``Process 75955 (python train.py) has 14.17 GiB memory in use``, as torch's OOM message says it."""
    used = gib(proc.used_mib) if proc.used_mib is not None else "an unknown amount of"
    return f"Process {proc.pid} ({proc.command or '?'}) has {used} memory in use"


def others_holding(device: GpuDevice, ours: set[int]) -> list[GpuProcess]:
    """Processes not of our tree holding memory on ``device``, largest first."""
    others = [p for p in device.processes if p.pid not in ours]
    return sorted(others, key=lambda p: -(p.used_mib or 0.0))


def free_memory_error(stage: str, device: GpuDevice, need_mib: float, ours: set[int]) -> str | None:
    """The error to raise when ``device`` has less free memory than ``stage`` needs, else None."""
    if need_mib <= 0 or device.free_mib >= need_mib:
        return None
    others = others_holding(device, ours)
    held = "; ".join(describe(p) for p in others) if others else "no other process is listed by the driver"
    return (
        f"{stage} needs about {gib(need_mib)} of GPU memory but GPU {device.index} ({device.name}) has only "
        f"{gib(device.free_mib)} free of {gib(device.total_mib)}: {held}. Stop those processes, choose a smaller "
        "model or another device, or set PIPELINE_GPU_CHECK_FREE=false to try anyway"
    )


@dataclass(frozen=True)
class AfterCheck:
    #: MiB our process tree still holds on the device (0.0 is the proof); None when the driver does not say
    tree_mib: float | None
    #: device usage minus the pre-stage baseline, MiB, after discounting other processes' growth where known
    growth_mib: float
    #: the leak error, or None when memory came back
    leak: str | None


def check_after(
    stage: str, baseline: GpuDevice, after: GpuDevice, ours: set[int], tolerance_mib: float
) -> AfterCheck:
    """After a child exited: does our tree hold 0 MiB, and is the device back to its baseline?"""
    mine = [p for p in after.processes if p.pid in ours]
    unknown = any(p.used_mib is None for p in mine)
    tree = sum(p.used_mib or 0.0 for p in mine)
    others_before = sum(p.used_mib or 0.0 for p in baseline.processes if p.pid not in ours)
    others_after = sum(p.used_mib or 0.0 for p in after.processes if p.pid not in ours)
    growth = after.used_mib - baseline.used_mib - max(0.0, others_after - others_before)
    if mine:
        pids = ", ".join(str(p.pid) for p in mine)
        amount = "an unknown amount" if unknown and tree == 0 else f"{tree:.0f} MiB"
        leak = (
            f"{stage}: GPU memory leak: our process tree still holds {amount} on GPU {after.index} "
            f"after the stage child exited (pid {pids})"
        )
        return AfterCheck(None if unknown else tree, growth, leak)
    if growth > tolerance_mib:
        leak = (
            f"{stage}: GPU memory leak: GPU {after.index} usage did not return to its pre-stage baseline: "
            f"{baseline.used_mib:.0f} MiB before, {after.used_mib:.0f} MiB after (+{growth:.0f} MiB, "
            f"tolerance {tolerance_mib:.0f} MiB)"
        )
        return AfterCheck(0.0, growth, leak)
    return AfterCheck(0.0, growth, None)


def our_pids(*extra: int | None) -> set[int]:
    """This process, its live descendants, and ``extra`` pids (a child that just exited)."""
    me = psutil.Process()
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    return pids | {p for p in extra if p}


# -- the monitor ---------------------------------------------------------------


@dataclass
class GpuWatch:
    """One stage child under watch."""

    stage: str
    index: int
    baseline: GpuDevice
    pid: int | None = None
    process_peak_mib: float = 0.0
    device_peak_used_mib: float = 0.0
    sampler: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class StageGpuCheck:
    """What the parent saw of one stage child on the GPU (goes into the run report)."""

    index: int
    baseline_used_mib: float
    after_used_mib: float
    #: MiB our process tree held after the child exited: 0.0 is the proof that everything came back
    tree_after_mib: float | None
    process_peak_mib: float
    device_peak_used_mib: float
    leak: str | None


class GpuMonitor:
    """Watches stage children on the GPU through a :class:`GpuReader`; a no-op when there is no NVML."""

    def __init__(
        self,
        reader: GpuReader | None = None,
        *,
        tolerance_mib: float = _DEFAULTS["gpu_leak_tolerance_mib"].default,
        sample_s: float | None = _DEFAULTS["gpu_sample_s"].default,
        settle_s: float = 5.0,
        check_free: bool = _DEFAULTS["gpu_check_free"].default,
    ) -> None:
        self.reader = reader if reader is not None else NvmlReader()
        self.tolerance_mib = tolerance_mib
        self.sample_s = sample_s
        self.settle_s = settle_s
        self.check_free = check_free
        self._said_unavailable = False

    def read(self) -> GpuSnapshot | None:
        snapshot = self.reader.read()
        if snapshot.available:
            return snapshot
        if not self._said_unavailable:
            self._said_unavailable = True
            log.debug("GPU monitor off: %s", snapshot.reason)
        return None

    def before(self, stage: str, device: str, visible: str | None, need_mib: float) -> GpuWatch | None:
        """Name other processes on the child's GPU; raise GpuMemoryError when it lacks the memory the stage needs."""
        snapshot = self.read() if device != "cpu" else None
        if snapshot is None:
            return None
        index = nvml_index(device, visible, snapshot)
        if index is None:
            return None
        dev = snapshot.device(index)
        ours = our_pids()
        others = others_holding(dev, ours)
        if others:
            log.warning(
                "%s: before start, other processes hold memory on GPU %d: %s",
                stage,
                index,
                "; ".join(describe(p) for p in others),
            )
        log.info(
            "%s: GPU %d (%s) before start: %.0f MiB used, %.0f MiB free of %.0f MiB",
            stage,
            index,
            dev.name,
            dev.used_mib,
            dev.free_mib,
            dev.total_mib,
        )
        if self.check_free:
            error = free_memory_error(stage, dev, need_mib, ours)
            if error:
                raise GpuMemoryError(error)
        return GpuWatch(stage=stage, index=index, baseline=dev, device_peak_used_mib=dev.used_mib)

    def started(
        self,
        watch: GpuWatch | None,
        pid: int,
        on_sample: Callable[[GpuWatch, GpuDevice, float], None] | None = None,
    ) -> None:
        """Begin sampling the child's and the device's usage (peaks; ``on_sample`` gets each reading)."""
        if watch is None:
            return
        watch.pid = pid
        if not self.sample_s:
            return
        watch.sampler = threading.Thread(
            target=self._sample, args=(watch, on_sample), name=f"gpu-{watch.stage}", daemon=True
        )
        watch.sampler.start()

    def _sample(self, watch: GpuWatch, on_sample) -> None:
        while not watch.stop.is_set():
            try:
                self.sample(watch, on_sample)
            except Exception as exc:  # noqa: BLE001 - a failed sample must not end the sampling
                log.debug("GPU sample failed: %s", exc)
            watch.stop.wait(self.sample_s)

    def sample(self, watch: GpuWatch, on_sample=None) -> None:
        """One reading: update the peaks of ``watch``."""
        snapshot = self.reader.read()
        dev = snapshot.device(watch.index) if snapshot.available else None
        if dev is None:
            return
        child = {watch.pid} | _descendants(watch.pid)
        held = sum(p.used_mib or 0.0 for p in dev.processes if p.pid in child)
        watch.process_peak_mib = max(watch.process_peak_mib, held)
        watch.device_peak_used_mib = max(watch.device_peak_used_mib, dev.used_mib)
        if on_sample is not None:
            on_sample(watch, dev, held)

    def after(self, watch: GpuWatch | None) -> StageGpuCheck | None:
        """Stop sampling; check that the child's memory came back (waiting up to ``settle_s`` for the driver)."""
        if watch is None:
            return None
        if watch.sampler is not None:
            watch.stop.set()
            watch.sampler.join()
            watch.sampler = None
        deadline = time.monotonic() + self.settle_s
        while True:
            snapshot = self.reader.read()
            dev = snapshot.device(watch.index) if snapshot.available else None
            if dev is None:
                log.warning(
                    "%s: GPU %d could not be read after the stage: %s",
                    watch.stage,
                    watch.index,
                    snapshot.reason,
                )
                return None
            result = check_after(watch.stage, watch.baseline, dev, our_pids(watch.pid), self.tolerance_mib)
            if result.leak is None or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, self.settle_s))
        if result.leak:
            log.error("%s", result.leak)
        else:
            log.info(
                "%s: GPU %d after the stage: our process tree holds 0 MiB; device %.0f MiB used "
                "(baseline %.0f MiB, %+.0f MiB)",
                watch.stage,
                watch.index,
                dev.used_mib,
                watch.baseline.used_mib,
                result.growth_mib,
            )
        return StageGpuCheck(
            index=watch.index,
            baseline_used_mib=watch.baseline.used_mib,
            after_used_mib=dev.used_mib,
            tree_after_mib=result.tree_mib,
            process_peak_mib=watch.process_peak_mib,
            device_peak_used_mib=max(watch.device_peak_used_mib, dev.used_mib),
            leak=result.leak,
        )


def _descendants(pid: int | None) -> set[int]:
    if not pid:
        return set()
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()
