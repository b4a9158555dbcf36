"""``pipeline``: the command line. Settings are read here, once, and passed down."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import catalogue, export, gpu, models, process, report, serve, speakers

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Subprocess-isolated GPU transcription pipeline.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"pipeline (isostage) {version('isostage')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Every model stage runs in its own spawned child process with a fresh CUDA context."""


# the commands in the order `pipeline --help` lists them (typer lists the groups after the commands)
app.command()(process.process)
app.command()(process.langid)
app.command()(export.export)
app.command()(catalogue.index)
app.command()(catalogue.search)
app.command()(speakers.enroll)
app.command()(gpu.gpu)
app.command()(report.report)
app.command()(serve.serve)
app.add_typer(speakers.speakers_app, name="speakers")
app.add_typer(models.models_app, name="models")


def main() -> None:
    import signal

    # a file size limit (ulimit -f) makes writes fail with a clear error instead of killing the run
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    app(prog_name="pipeline")
