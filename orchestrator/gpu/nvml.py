"""GPU readings in the parent through NVML, which never creates a CUDA context.

NVML sits behind a small reader interface: :class:`NvmlReader` asks the
driver; :class:`RecordedReader` replays snapshots recorded earlier (for
example the output of ``pipeline gpu --json``), which is how the GPU logic is
tested on machines without a GPU. On such a machine ``NvmlReader`` returns an
"unavailable" snapshot, and the guard around stage children
(:mod:`orchestrator.gpu.guard`) does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field

from contracts.units import MIB


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
            for query in (
                nvml.nvmlDeviceGetComputeRunningProcesses,
                nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                try:
                    found = query(handle)
                except nvml.NVMLError:
                    continue
                for p in found:
                    used = p.usedGpuMemory / MIB if p.usedGpuMemory is not None else None
                    known = procs.get(p.pid)
                    procs[p.pid] = (
                        max(used, known) if used is not None and known is not None else (used or known)
                    )
            devices.append(
                GpuDevice(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    total_mib=mem.total / MIB,
                    used_mib=mem.used / MIB,
                    free_mib=mem.free / MIB,
                    processes=[
                        GpuProcess(pid=pid, used_mib=used, command=command_of(pid))
                        for pid, used in procs.items()
                    ],
                )
            )
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


def device_problem(device: str, visible: str | None, snapshot: GpuSnapshot) -> str | None:
    """Why ``device`` (``PIPELINE_DEVICE``) names no GPU of this machine, in one line, or None: ``cuda[:N]``
    needs NVML to read the Nth visible GPU (refused before a run, where every input would fail in its
    child with a model error)."""
    if not device.startswith("cuda"):
        return None
    if not snapshot.available:
        return (
            f"--device {device}: no CUDA GPU can be read on this machine ({snapshot.reason}); "
            "use --device auto or cpu"
        )
    if nvml_index(device, visible, snapshot) is None:
        seen = ", ".join(f"cuda:{d.index} {d.name}" for d in snapshot.devices) or "none"
        shown = f" among CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
        return f"--device {device}: no such GPU{shown} (NVML reads {seen}); use --device auto, cpu or cuda:0"
    return None


def visible_devices(env: dict[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES as a child will see it: from its request's env, else inherited from ours."""
    return env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
