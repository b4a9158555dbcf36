"""GPU readings in the parent through NVML, which never creates a CUDA context.

NVML sits behind a small reader interface: :class:`NvmlReader` asks the
driver; :class:`RecordedReader` replays snapshots recorded earlier (for
example the output of ``pipeline gpu --json``), which is how the logic here is
tested on machines without a GPU. On such a machine ``NvmlReader`` returns an
"unavailable" snapshot and the :class:`GpuMonitor` does nothing (it says so
once, at debug level).

What the monitor does around each stage child:

- before: name the *other* processes holding VRAM on the child's device (PID,
  command, MiB) and refuse to start when free memory is below what the stage
  needs (:class:`contracts.errors.GpuMemoryError`);
- while it runs: sample the device's usage and the child's own usage (peaks);
- after it exits: prove that our process tree holds 0 MiB on the device and
  that device usage is back to the pre-stage baseline within a tolerance;
  otherwise log a leak error naming the stage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field

from contracts.errors import GpuMemoryError
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: the monitor's defaults are the settings' (declared once, in orchestrator.settings)
_DEFAULTS = Settings.model_fields

MIB = 1024**2


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuProcess(_Frozen):
    pid: int
    #: None when the driver does not report it (some containers, MIG, older drivers)
    used_mib: float | None = None
    command: str = ""


class GpuDevice(_Frozen):
    #: NVML index (PCI bus order, as nvidia-smi numbers devices)
    index: int
    name: str
    uuid: str = ""
    total_mib: float
    used_mib: float
    free_mib: float
    processes: list[GpuProcess] = Field(default_factory=list)


class GpuSnapshot(_Frozen):
    """Everything NVML says at one moment (the JSON of ``pipeline gpu --json``)."""

    available: bool
    #: why there is no reading, when not available
    reason: str | None = None
    driver: str | None = None
    t: float = Field(default_factory=time.time)
    devices: list[GpuDevice] = Field(default_factory=list)

    def device(self, index: int) -> GpuDevice | None:
        return next((d for d in self.devices if d.index == index), None)


class GpuReader(Protocol):
    def read(self) -> GpuSnapshot: ...


def _unavailable(reason: str) -> GpuSnapshot:
    return GpuSnapshot(available=False, reason=reason)


def command_of(pid: int) -> str:
    """A process's command line, shortened; a placeholder when it cannot be seen from here."""
    try:
        proc = psutil.Process(pid)
        text = " ".join(proc.cmdline()) or proc.name()
    except psutil.NoSuchProcess:
        return "(not visible from here: another PID namespace, or already gone)"
    except psutil.AccessDenied:
        return "(access denied)"
    return text if len(text) <= 120 else text[:117] + "..."


class NvmlReader:
    """Reads the driver through NVML (nvidia-ml-py). Never raises: failures become "unavailable"."""

    def __init__(self) -> None:
        self._ready = False
        self._error: str | None = None
        self._lock = threading.Lock()

    def _init(self):
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            self._error = f"nvidia-ml-py is not installed ({exc})"
            return None
        if not self._ready and self._error is None:
            try:
                pynvml.nvmlInit()
                self._ready = True
            except pynvml.NVMLError as exc:
                self._error = f"NVML is not available: {exc} (no NVIDIA driver on this machine?)"
        return pynvml if self._ready else None

    def read(self) -> GpuSnapshot:
        with self._lock:
            nvml = self._init()
            if nvml is None:
                return _unavailable(self._error or "NVML is not available")
            try:
                return self._read(nvml)
            except nvml.NVMLError as exc:
                return _unavailable(f"NVML query failed: {exc}")

    @staticmethod
    def _read(nvml) -> GpuSnapshot:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            procs: dict[int, float | None] = {}
            for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    found = query(handle)
                except nvml.NVMLError:
                    continue
                for p in found:
                    used = p.usedGpuMemory / MIB if p.usedGpuMemory is not None else None
                    known = procs.get(p.pid)
                    procs[p.pid] = max(used, known) if used is not None and known is not None else (used or known)
            devices.append(GpuDevice(
                index=index, name=_text(nvml.nvmlDeviceGetName(handle)), uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                total_mib=mem.total / MIB, used_mib=mem.used / MIB, free_mib=mem.free / MIB,
                processes=[GpuProcess(pid=pid, used_mib=used, command=command_of(pid)) for pid, used in procs.items()],
            ))
        return GpuSnapshot(available=True, driver=_text(nvml.nvmlSystemGetDriverVersion()), devices=devices)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RecordedReader:
    """Replays recorded snapshots in order; the last one repeats."""

    def __init__(self, snapshots: Sequence[GpuSnapshot]) -> None:
        if not snapshots:
            raise ValueError("a recorded reader needs at least one snapshot")
        self.snapshots = list(snapshots)
        self.reads = 0

    @classmethod
    def from_file(cls, path: str | Path) -> RecordedReader:
        """Snapshots from a JSON-lines file (one ``pipeline gpu --json`` output per line)."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return cls([GpuSnapshot.model_validate_json(line) for line in lines if line.strip()])

    def read(self) -> GpuSnapshot:
        snapshot = self.snapshots[min(self.reads, len(self.snapshots) - 1)]
        self.reads += 1
        return snapshot


# -- which NVML device a child's "cuda:N" is ---------------------------------

def nvml_index(device: str, visible: str | None, snapshot: GpuSnapshot) -> int | None:
    """The NVML index of the GPU a child asked for ``device`` will use, or None (CPU / not mappable).

    ``cuda:N`` counts among ``CUDA_VISIBLE_DEVICES`` (indexes or ``GPU-`` UUID
    prefixes); children get ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's order is
    NVML's (and nvidia-smi's).
    """
    if device == "cpu":
        return None
    _, _, ordinal_text = device.partition(":")
    ordinal = int(ordinal_text or 0)
    if visible is None:
        return ordinal if snapshot.device(ordinal) is not None else None
    entries = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            break
        if entry.isdigit():
            entries.append(int(entry))
        elif entry.startswith("GPU-"):
            match = [d.index for d in snapshot.devices if d.uuid.startswith(entry)]
            if len(match) != 1:
                break
            entries.append(match[0])
        else:  # MIG-... or an invalid entry: CUDA stops enumerating here
            break
    if ordinal >= len(entries):
        return None
    return entries[ordinal] if snapshot.device(entries[ordinal]) is not None else None


# -- pure checks -------------------------------------------------------------

def gib(mib: float) -> str:
    return f"{mib / 1024:.2f} GiB"


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


def check_after(stage: str, baseline: GpuDevice, after: GpuDevice, ours: set[int], tolerance_mib: float) -> AfterCheck:
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
        leak = (f"{stage}: GPU memory leak: our process tree still holds {amount} on GPU {after.index} "
                f"after the stage child exited (pid {pids})")
        return AfterCheck(None if unknown else tree, growth, leak)
    if growth > tolerance_mib:
        leak = (f"{stage}: GPU memory leak: GPU {after.index} usage did not return to its pre-stage baseline: "
                f"{baseline.used_mib:.0f} MiB before, {after.used_mib:.0f} MiB after (+{growth:.0f} MiB, "
                f"tolerance {tolerance_mib:.0f} MiB)")
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

    def __init__(self, reader: GpuReader | None = None, *,
                 tolerance_mib: float = _DEFAULTS["gpu_leak_tolerance_mib"].default,
                 sample_s: float | None = _DEFAULTS["gpu_sample_s"].default, settle_s: float = 5.0,
                 check_free: bool = _DEFAULTS["gpu_check_free"].default) -> None:
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
            log.warning("%s: before start, other processes hold memory on GPU %d: %s", stage, index,
                        "; ".join(describe(p) for p in others))
        log.info("%s: GPU %d (%s) before start: %.0f MiB used, %.0f MiB free of %.0f MiB", stage, index, dev.name,
                 dev.used_mib, dev.free_mib, dev.total_mib)
        if self.check_free:
            error = free_memory_error(stage, dev, need_mib, ours)
            if error:
                raise GpuMemoryError(error)
        return GpuWatch(stage=stage, index=index, baseline=dev, device_peak_used_mib=dev.used_mib)

    def started(self, watch: GpuWatch | None, pid: int, on_sample: Callable[[GpuWatch, GpuDevice, float], None] | None = None) -> None:
        """Begin sampling the child's and the device's usage (peaks; ``on_sample`` gets each reading)."""
        if watch is None:
            return
        watch.pid = pid
        if not self.sample_s:
            return
        watch.sampler = threading.Thread(target=self._sample, args=(watch, on_sample), name=f"gpu-{watch.stage}",
                                         daemon=True)
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
                log.warning("%s: GPU %d could not be read after the stage: %s", watch.stage, watch.index,
                            snapshot.reason)
                return None
            result = check_after(watch.stage, watch.baseline, dev, our_pids(watch.pid), self.tolerance_mib)
            if result.leak is None or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, self.settle_s))
        if result.leak:
            log.error("%s", result.leak)
        else:
            log.info("%s: GPU %d after the stage: our process tree holds 0 MiB; device %.0f MiB used "
                     "(baseline %.0f MiB, %+.0f MiB)", watch.stage, watch.index, dev.used_mib,
                     watch.baseline.used_mib, result.growth_mib)
        return StageGpuCheck(
            index=watch.index, baseline_used_mib=watch.baseline.used_mib, after_used_mib=dev.used_mib,
            tree_after_mib=result.tree_mib, process_peak_mib=watch.process_peak_mib,
            device_peak_used_mib=max(watch.device_peak_used_mib, dev.used_mib), leak=result.leak,
        )


def _descendants(pid: int | None) -> set[int]:
    if not pid:
        return set()
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def visible_devices(env: dict[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES as a child will see it: from its request's env, else inherited from ours."""
    return env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
