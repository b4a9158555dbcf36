"""``pipeline report RUN``: a summary table of a run's performance log and a PNG of memory over time.

``RUN`` is a ``performance_logs/<run>.jsonl`` file, an output directory (its
newest run), its ``performance_logs/`` directory, or a ``.runs/<run>``
directory. matplotlib is imported only when the plot is drawn (Agg backend,
no display needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from contracts import load_model
from contracts.errors import ArtifactError, SettingsError
from contracts.perf import PerfEvent, read_events
from contracts.report import Attempt, RunReport, StageRun
from contracts.units import GIB_MIB as GIB
from contracts.units import gib
from orchestrator import layout
from orchestrator.telemetry.perf_log import DIRECTORY
from orchestrator.telemetry.timings import Exposure, StageTimes, computing, exposure, stage_times


def find_perf_log(path: str | Path) -> Path:
    """The performance log ``path`` designates (see the module doc); SettingsError when there is none."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir() and path.parent.name == ".runs":  # OUT/.runs/<run>
        candidate = path.parent.parent / DIRECTORY / f"{path.name}.jsonl"
        if candidate.is_file():
            return candidate
        raise SettingsError(f"no performance log for run {path.name}: {candidate} does not exist")
    for directory in (path / DIRECTORY, path):
        logs = (
            sorted(directory.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if directory.is_dir() else []
        )
        if logs:
            return logs[-1]
    raise SettingsError(
        f"no performance log found at {path} (expected a .jsonl file, an output directory with "
        f"{DIRECTORY}/, or OUT/.runs/<run>)"
    )


def summarize(events: list[PerfEvent]) -> list[Attempt]:
    """One record per stage child, in the order they ended (pure): the ``stage_end`` event's record,
    with what the live events add when the child died before reporting (checkpoints, NVML samples)."""
    live: dict[tuple[str, int], dict[str, float | None]] = {}
    records: list[Attempt] = []
    for e in events:
        if e.stage is None or e.attempt is None:
            continue
        seen = live.setdefault((e.stage, e.attempt), {})
        if e.event == "checkpoint":
            seen["peak_rss_mb"] = _max(seen.get("peak_rss_mb"), e.peak_rss_mb, e.rss_mb)
            if e.kind == "gpu" and e.total_mb:
                seen["max_allocated_pct"] = _max(
                    seen.get("max_allocated_pct"), 100.0 * (e.allocated_mb or 0.0) / e.total_mb
                )
                seen["peak_vram_mb"] = _max(seen.get("peak_vram_mb"), e.allocated_mb)
        elif e.event == "gpu_sample":
            seen["gpu_process_peak_mib"] = _max(seen.get("gpu_process_peak_mib"), e.process_mib)
        elif e.event == "stage_end" and e.record is not None:
            missing = {k: v for k, v in seen.items() if getattr(e.record, k) is None and v is not None}
            records.append(
                Attempt.model_validate({**e.record.model_dump(), **missing}) if missing else e.record
            )
    return records


def _max(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


@dataclass(frozen=True)
class RunPeaks:
    #: highest device usage NVML saw during the run (MiB), all processes included
    device_peak_mib: float | None
    #: the largest single stage's own peak (MiB) and its name
    largest_stage_mib: float | None
    largest_stage: str | None


def run_peaks(events: list[PerfEvent], summaries: list[Attempt]) -> RunPeaks:
    """Peak VRAM of the run vs the largest single stage: with one child per stage they should be about equal."""
    device = _max(*(e.device_used_mib for e in events if e.event in ("gpu_sample", "gpu_check")))
    staged = [(s.peak_gpu_mib, s.stage) for s in summaries if s.peak_gpu_mib]
    largest = max(staged) if staged else (None, None)
    return RunPeaks(device, largest[0], largest[1])


#: a Ray node id is 56 hex digits; its first 12 tell the nodes of a cluster apart
NODE_CHARS = 12


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}{unit}"


def _gib(mib: float | None) -> str:
    return "—" if mib is None else gib(mib)


def table(summaries: list[Attempt], title: str = "") -> Table:
    """One row per stage child; a "node" column (the Ray node's id, shortened) when any child ran on one."""
    t = Table(title=title or None)
    nodes = any(s.node for s in summaries)
    for name, justify in [
        ("stage", "left"),
        *([("node", "left")] if nodes else []),
        ("try", "right"),
        ("batch", "right"),
        ("outcome", "left"),
        ("ok/failed", "right"),
        ("wall", "right"),
        ("items/s", "right"),
        ("device", "left"),
        ("peak VRAM (torch)", "right"),
        ("peak VRAM (NVML)", "right"),
        ("max alloc %", "right"),
        ("after exit", "left"),
        ("peak RSS", "right"),
        ("compute CPU", "right"),
    ]:
        t.add_column(name, justify=justify)
    for s in summaries:
        if s.gpu_leak:
            after = f"[red]LEAK: {s.gpu_leak}[/red]"
        elif s.gpu_tree_after_mib is not None:
            after = f"[green]{s.gpu_tree_after_mib:.0f} MiB held[/green]"
        else:
            after = "—"
        t.add_row(
            s.stage,
            *([(s.node or "—")[:NODE_CHARS]] if nodes else []),
            str(s.attempt),
            _fmt(s.batch_size, digits=0) if s.batch_size else "—",
            s.outcome or "?",
            f"{s.ok if s.ok is not None else '—'}/{s.failed if s.failed is not None else '—'}",
            _fmt(s.wall_s, " s"),
            _fmt(s.items_per_s, digits=2),
            s.device or "—",
            _gib(s.peak_vram_mb),
            _gib(s.gpu_process_peak_mib),
            _fmt(s.max_allocated_pct, " %"),
            after,
            _gib(s.peak_rss_mb),
            compute_cpu(s),
        )
    return t


def compute_cpu(s: Attempt) -> str:
    """The child's CPU seconds over its compute, how many cores that kept busy on average, and the
    kernel's share (page faults, system calls): "197 s, 1.58 cores, 36 % system"."""
    cpu = s.compute_cpu
    if cpu is None:
        return "—"
    cores = f", {cpu.cpu_s / s.compute_s:.2f} cores" if s.compute_s else ""
    system = 100.0 * cpu.system_s / cpu.cpu_s if cpu.cpu_s else 0.0
    return f"{cpu.cpu_s:.0f} s{cores}, {system:.0f} % system"


def plot(events: list[PerfEvent], png: str | Path, title: str = "") -> Path:
    """Memory over time per stage: GPU (torch allocated/reserved, NVML process) and CPU (process RSS) panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if not events:
        raise SettingsError("the performance log has no events to plot")
    t0 = min(e.t for e in events)
    stages = list(dict.fromkeys(e.stage for e in events if e.stage))
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(stages)}
    checkpoints = [e for e in events if e.event == "checkpoint"]
    samples = [e for e in events if e.event == "gpu_sample"]
    gpu = [e for e in checkpoints if e.kind == "gpu"]
    cpu = [e for e in checkpoints if e.kind == "cpu"]
    panels = [name for name, present in (("gpu", gpu or samples), ("cpu", cpu)) if present] or ["cpu"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.8 * len(panels)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        _spans(ax, events, t0, colors)
        for stage in stages:
            color = colors[stage]
            for attempt in sorted(
                {e.attempt for e in checkpoints + samples if e.stage == stage and e.attempt}
            ):
                label = stage if attempt == 1 else f"{stage} (try {attempt})"
                mine = [
                    e for e in (gpu if panel == "gpu" else cpu) if e.stage == stage and e.attempt == attempt
                ]
                if panel == "gpu":
                    _line(ax, mine, t0, "allocated_mb", color, "-", None, f"{label}: allocated (torch)")
                    _line(ax, mine, t0, "reserved_mb", color, "--", None, f"{label}: reserved (torch)")
                    nvml = [e for e in samples if e.stage == stage and e.attempt == attempt]
                    _line(ax, nvml, t0, "process_mib", color, ":", "+", f"{label}: process (NVML)")
                else:
                    _line(ax, mine, t0, "rss_mb", color, "-", None, f"{label}: RSS")
                for e in mine:  # the checkpoint's kind as a marker shape (second legend)
                    value = e.allocated_mb if panel == "gpu" else e.rss_mb
                    ax.plot(
                        e.t - t0,
                        (value or 0) / GIB,
                        linestyle="none",
                        marker=_marker(e.point),
                        color=color,
                        markersize=8,
                        markeredgecolor="black",
                        markeredgewidth=0.5,
                    )
        if panel == "gpu":
            total = _max(*(e.total_mb for e in gpu), *(e.device_total_mib for e in samples))
            if total:
                ax.axhline(total / GIB, color="grey", linewidth=0.8)
                ax.text(
                    1.0,
                    total / GIB,
                    f"device total {total / GIB:.1f} GiB ",
                    transform=ax.get_yaxis_transform(),
                    ha="right",
                    va="bottom",
                    fontsize=8,
                    color="grey",
                )
            ax.set_ylabel("GPU memory (GiB)")
            ax.set_title("GPU memory per stage")
        else:
            ax.set_ylabel("process RSS (GiB)")
            ax.set_title("CPU memory per stage (process RSS: these stages had no CUDA device)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        # legend: stage = colour, series = line style, checkpoint = marker shape
        shown = [e for e in (gpu + samples if panel == "gpu" else cpu)]
        handles = [
            Patch(color=colors[st], alpha=0.6, label=st) for st in stages if any(e.stage == st for e in shown)
        ]
        series = (
            [("allocated (torch)", "-", None), ("reserved (torch)", "--", None), ("process (NVML)", ":", "+")]
            if panel == "gpu"
            else [("process RSS", "-", None)]
        )
        handles += [
            Line2D([], [], color="black", linestyle=style, marker=mark, label=name)
            for name, style, mark in series
        ]
        seen = list(dict.fromkeys(_marker_name(e.point) for e in shown if e.event == "checkpoint"))
        handles += [
            Line2D(
                [],
                [],
                linestyle="none",
                marker=MARKERS[name],
                color="grey",
                markeredgecolor="black",
                markeredgewidth=0.5,
                markersize=8,
                label=name,
            )
            for name in seen
        ]
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("seconds since the run's first event")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight")  # keeps the legends outside the axes
    plt.close(fig)
    return png


#: checkpoint -> marker shape in the plot
MARKERS = {
    "before model load": "^",
    "model loaded": "s",
    "after item": "o",
    "before exit": "v",
    "at failure": "X",
    "other": "D",
}


def _marker_name(point: str | None) -> str:
    point = point or ""
    if point.startswith("after item"):
        return "after item"
    return point if point in MARKERS else "other"


def _marker(point: str | None) -> str:
    return MARKERS[_marker_name(point)]


def _line(ax, events: list[PerfEvent], t0: float, field: str, color, style: str, marker, label: str) -> None:
    points = [(e.t - t0, getattr(e, field) / GIB) for e in events if getattr(e, field) is not None]
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, linestyle=style, marker=marker, color=color, label=label, markersize=7)


def _spans(ax, events: list[PerfEvent], t0: float, colors) -> None:
    starts = {(e.stage, e.attempt): e.t for e in events if e.event == "stage_start"}
    for e in events:
        if e.event == "stage_end" and (e.stage, e.attempt) in starts:
            start = starts[(e.stage, e.attempt)] - t0
            ax.axvspan(start, e.t - t0, color=colors.get(e.stage, "grey"), alpha=0.08)
            ax.text(
                start,
                1.0,
                f" {e.stage}" + (f" #{e.attempt}" if e.attempt and e.attempt > 1 else ""),
                transform=ax.get_xaxis_transform(),
                va="top",
                fontsize=8,
                color=colors.get(e.stage, "grey"),
            )


def run_report_of(perf_log: Path) -> RunReport | None:
    """The run report the run wrote beside its performance log (``OUT/.runs/<run>/run-report.json``), or
    None (a run killed before its end, or a log moved away from its output folder)."""
    path = perf_log.parent.parent / layout.RUNS / perf_log.stem / layout.REPORT
    try:
        return load_model(path, RunReport) if path.is_file() else None
    except ArtifactError:
        return None


def where_time_went(
    events: list[PerfEvent], summaries: list[Attempt], report: RunReport | None
) -> tuple[list[StageTimes], Exposure | None]:
    """Per stage: waited, import, load, model, host, per audio hour; and the run's exposed time. From the
    run report when there is one (it knows each stage's wait); else from the performance log alone (no
    waits; the run's wall from its first event to its last)."""
    if report is not None and report.computing_s is not None:
        runs = report.stages
        exposed = Exposure(report.wall_s, report.computing_s, report.exposed_s or 0.0)
        return stage_times(runs), exposed
    runs = [StageRun(stage=a.stage, attempts=[a]) for a in summaries]
    times = [e.t for e in events]
    exposed = exposure(computing(summaries), min(times), max(times)) if times else None
    return stage_times(runs), exposed


def stage_table(times: list[StageTimes], title: str = "") -> Table:
    """One row per stage: where its seconds went (sums over its chunks and respawns)."""
    t = Table(title=title or None)
    for name in ("stage", "waited", "import", "load", "model", "host", "compute per audio h", "audio"):
        t.add_column(name, justify="left" if name == "stage" else "right")
    for s in times:
        t.add_row(
            s.stage,
            _fmt(s.waited_s, " s"),
            _fmt(s.import_s, " s"),
            _fmt(s.load_s, " s"),
            _fmt(s.model_s, " s"),
            _fmt(s.host_s, " s"),
            _fmt(s.per_audio_hour, " s"),
            _fmt(s.audio_s, " s"),
        )
    return t


def exposed_line(exposed: Exposure) -> str:
    """The run's exposed time in one line."""
    return (
        f"exposed {exposed.exposed_s:.1f} s of {exposed.wall_s:.1f} s: no stage child computing "
        f"(start-ups, loads, waits, the parent's own work); computing {exposed.computing_s:.1f} s"
    )


@dataclass(frozen=True)
class Report:
    log: Path
    png: Path
    summaries: list[Attempt]
    peaks: RunPeaks
    #: per stage, where its seconds went
    stages: list[StageTimes]
    #: the run's wall outside its children's compute (None: an empty log)
    exposed: Exposure | None


def build(run: str | Path, png: str | Path | None = None) -> Report:
    """Read the run's performance log (and its run report, when it is beside it), write its PNG (next to the
    log unless ``png`` is given)."""
    path = find_perf_log(run)
    events = read_events(path)
    summaries = summarize(events)
    out = plot(events, png or path.with_suffix(".png"), title=f"run {path.stem}")
    stages, exposed = where_time_went(events, summaries, run_report_of(path))
    return Report(path, out, summaries, run_peaks(events, summaries), stages, exposed)
