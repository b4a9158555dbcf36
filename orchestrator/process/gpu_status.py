"""``pipeline gpu``: devices, memory, who holds VRAM, and ``--cleanup`` of orphaned stage children.

Built from one :class:`orchestrator.gpu.nvml.GpuSnapshot` (NVML; no CUDA context)
and the pid files of :mod:`orchestrator.process.pidfiles`. Without NVML it says so and
still lists (and cleans up) this project's stage children.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from contracts.units import gib
from orchestrator.gpu.nvml import GpuSnapshot
from orchestrator.process.pidfiles import ChildRecord, ChildRegistry, Cleanup


def _record(r: ChildRecord) -> dict[str, Any]:
    return {
        "pid": r.pid,
        "stage": r.stage,
        "parent_pid": r.parent_pid,
        "request": r.request,
        "create_time": r.create_time,
    }


def as_json(snapshot: GpuSnapshot, registry: ChildRegistry, cleanup: Cleanup | None) -> dict[str, Any]:
    """The ``--json`` document: the snapshot, our known stage children, and what cleanup did."""
    doc: dict[str, Any] = snapshot.model_dump(mode="json")
    doc["pid_dir"] = str(registry.directory)
    doc["stage_children"] = [
        _record(r) | {"orphan": not r.parent_alive(), "alive": r.child_alive()} for r in registry.records()
    ]
    if cleanup is not None:
        doc["cleanup"] = {
            "stopped": [_record(r) for r in cleanup.stopped],
            "left_running": [_record(r) for r in cleanup.running],
            "stale_removed": [_record(r) for r in cleanup.stale],
            "failed": [_record(r) | {"reason": why} for r, why in cleanup.failed],
        }
    return doc


def render(snapshot: GpuSnapshot, registry: ChildRegistry) -> Group:
    parts: list = []
    if not snapshot.available:
        parts.append(Text(f"GPU: not available: {snapshot.reason}", style="yellow"))
    elif not snapshot.devices:
        parts.append(Text(f"GPU: NVML works (driver {snapshot.driver}) but sees no device", style="yellow"))
    else:
        ours = {r.pid: r for r in registry.records() if r.child_alive()}
        devices = Table(title=f"GPUs (NVML, driver {snapshot.driver})")
        for name in ("GPU", "name", "used", "free", "total", "used %"):
            devices.add_column(name, justify="left" if name == "name" else "right")
        procs = Table(title="Processes holding VRAM")
        for name in ("GPU", "PID", "MiB", "command"):
            procs.add_column(name, justify="right" if name in ("GPU", "PID", "MiB") else "left")
        for d in snapshot.devices:
            devices.add_row(
                str(d.index),
                d.name,
                gib(d.used_mib),
                gib(d.free_mib),
                gib(d.total_mib),
                f"{100 * d.used_mib / d.total_mib:.1f}",
            )
            for p in sorted(d.processes, key=lambda p: -(p.used_mib or 0)):
                command = p.command
                if p.pid in ours:
                    command = f"[isostage {ours[p.pid].stage} stage child] {command}"
                procs.add_row(
                    str(d.index), str(p.pid), "?" if p.used_mib is None else f"{p.used_mib:.0f}", command
                )
        parts.append(devices)
        parts.append(procs if procs.row_count else Text("No process holds VRAM."))
    children = registry.records()
    if children:
        t = Table(title=f"This project's stage children ({registry.directory})")
        for name in ("PID", "stage", "pipeline PID", "state"):
            t.add_column(name)
        for r in children:
            state = (
                "exited (stale pid file)"
                if not r.child_alive()
                else "running"
                if r.parent_alive()
                else "ORPHAN (pipeline gone): pipeline gpu --cleanup stops it"
            )
            t.add_row(str(r.pid), r.stage, str(r.parent_pid), state)
        parts.append(t)
    return Group(*parts)


def render_cleanup(cleanup: Cleanup, registry: ChildRegistry) -> Text:
    lines = []
    for r in cleanup.stopped:
        lines.append(f"stopped orphaned stage child {r.describe()}")
    for r, why in cleanup.failed:
        lines.append(f"could not stop orphaned stage child {r.describe()}: {why}")
    for r in cleanup.running:
        lines.append(f"left alone: pid {r.pid} ({r.stage}), its pipeline pid {r.parent_pid} is still running")
    for r in cleanup.stale:
        lines.append(f"removed stale pid file of pid {r.pid} ({r.stage}): that child already exited")
    if not lines:
        lines.append(f"nothing to clean up: no stage child recorded in {registry.directory}")
    return Text("\n".join(lines))
