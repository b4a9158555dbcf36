"""``pipeline report RUN``: a run's performance log as a table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from contracts import ExitCode
from orchestrator.cli.common import NORMAL, setup_logging


def report(
    run: Annotated[
        Path,
        typer.Argument(
            help="performance_logs/<run>.jsonl, an output directory (newest run) or OUT/.runs/<run>."
        ),
    ],
    png: Annotated[
        Path | None, typer.Option(help="Where to write the plot [default: next to the log].")
    ] = None,
) -> None:
    """Summary table of a run's performance log, and a PNG of memory over time per stage."""
    from rich.console import Console

    from contracts.errors import SettingsError
    from contracts.units import gib
    from orchestrator.telemetry.perf_report import build, exposed_line, stage_table, table

    setup_logging(NORMAL)
    try:
        built = build(run, png)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    console = Console(width=max(Console().width, 200))  # 13 columns: do not squeeze them when piped
    console.print(table(built.summaries, title=f"run {built.log.stem}"))
    peaks = built.peaks
    if peaks.device_peak_mib is not None or peaks.largest_stage_mib is not None:
        device = "—" if peaks.device_peak_mib is None else gib(peaks.device_peak_mib)
        largest = (
            "—"
            if peaks.largest_stage_mib is None
            else f"{gib(peaks.largest_stage_mib)} ({peaks.largest_stage})"
        )
        console.print(f"peak VRAM of the run (device, NVML): {device}; largest single stage: {largest}")
    if built.stages:
        console.print(stage_table(built.stages, title="where the time went, per stage"))
    if built.exposed is not None:
        console.print(exposed_line(built.exposed))
    console.print(f"log: {built.log}\nplot: {built.png}")
