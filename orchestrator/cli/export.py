"""``pipeline export OUT``: the files of each input written again from its stored artifacts."""

from __future__ import annotations

from typing import Annotated

import typer

from contracts import ExitCode
from orchestrator.cli.common import OutArg, WaitOpt, fail, settings_from, setup_logging, verbosity_of


def export(
    output: OutArg,
    formats: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help=(
                "Comma-separated: srt, vtt, txt, tsv, json, rttm, textgrid, eaf, docx, html, aud, "
                "or all [default: env PIPELINE_FORMATS, else srt,vtt,txt,html]."
            ),
        ),
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--inputs", help="Only these inputs (ids or sources; repeatable) [default: all]."),
    ] = None,
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every file.")] = False,
) -> None:
    """Write the files of each input again from its stored artifacts, with the current caption settings
    (CAPTION_*), speaker names and the run's notes; starts no model child. Then OUT/index.html. What it
    writes is recorded in the journal: the next `process` keeps it. Exit 1: an input failed or
    speakers.json is damaged; 5: a disk is full (rerun to finish)."""
    from orchestrator.corpus.export import export as run_export
    from orchestrator.layout import FORMATS

    setup_logging(verbosity_of(verbose))
    if not output.is_dir():
        typer.echo(f"error: {output} is not a directory", err=True)
        raise typer.Exit(ExitCode.USAGE)
    if formats is not None and formats.strip().lower() == "all":
        formats = ",".join(FORMATS)
    overrides = {"output_dir": output, "export_formats": formats, "wait_for_output": wait or None}
    settings = settings_from(overrides)
    try:
        result = run_export(settings, settings.export_formats, inputs)
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        fail(exc, output)
    for name in result.unknown:
        typer.echo(f"UNKNOWN {name}: not an input of {output}", err=True)
    for item_id, why in result.failed.items():
        typer.echo(f"FAILED {item_id}: {why}", err=True)
    typer.echo(
        f"{result.written} inputs, {result.files} files ({','.join(settings.export_formats)}) in "
        f"{result.seconds:.1f} s; index: {output / 'index.html'}",
        err=True,
    )
    raise typer.Exit(ExitCode.USAGE if result.unknown else ExitCode.FAILED if result.failed else ExitCode.OK)
