"""What more than one command uses, declared once: the shared options, the console's verbosity and
logging, the settings from the flags, the one-line failures and their exit codes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from contracts import ExitCode

log = logging.getLogger("orchestrator.cli")


#: what the console shows at each verbosity (the children's logs are always in OUT/.runs/<run>/*.log)
QUIET, NORMAL, VERBOSE = -1, 0, 1


# -- options shared by several commands (one declaration each) ------------------------------------------
OutputOpt = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        help="Output directory or fsspec URL [env PIPELINE_OUTPUT_DIR / PIPELINE_OUTPUT_URL, default ./out].",
    ),
]
DeviceOpt = Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N [env PIPELINE_DEVICE].")]
ChunkSizeOpt = Annotated[
    int | None, typer.Option(min=1, help="Inputs per stage child [env PIPELINE_CHUNK_SIZE, default 50].")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo every stage, even for current artifacts.")]
RunWaitOpt = Annotated[
    bool, typer.Option("--wait", help="Wait while another run uses the output directory [env PIPELINE_WAIT].")
]
RunVerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Stream every log line, the stage children's too.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print failures and the summary only.")]
OutArg = Annotated[
    Path, typer.Argument(help="The output directory of earlier `process` runs.", show_default=False)
]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="Wait while a run uses the output directory [env PIPELINE_WAIT].")
]


def setup_logging(verbosity: int, console=None) -> None:
    """Plain log lines on pipes and files; on a terminal, rich logging above the progress display.

    ``NORMAL``: progress lines and warnings of this process; the stage children's own log lines stay in
    their log files. ``VERBOSE`` (-v): everything at debug level, the children's lines streamed as
    ``[stage] ...``. ``QUIET`` (-q): warnings and errors only (failures and the summary are printed anyway).
    """
    level = logging.DEBUG if verbosity >= VERBOSE else logging.WARNING
    if console is not None and console.is_terminal:
        from rich.logging import RichHandler

        logging.basicConfig(
            level=level,
            format="%(name)s: %(message)s",
            datefmt="%H:%M:%S",
            force=True,
            handlers=[RichHandler(console=console, show_path=False)],
        )
    else:
        logging.basicConfig(
            level=level,
            format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
            stream=sys.stderr,
            force=True,
        )
    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # sftp:// logs every channel at INFO
    from orchestrator.remote import redact_logs

    redact_logs(logging.getLogger().handlers)  # no URL password or signature in any line (-v: fsspec's too)
    if verbosity == NORMAL:  # progress lines (and this command's own) at INFO
        for name in ("orchestrator.run.progress", "orchestrator.cli"):
            logging.getLogger(name).setLevel(logging.INFO)
    if verbosity < VERBOSE:  # children's lines: in their log files only
        logging.getLogger("orchestrator.child").setLevel(logging.CRITICAL + 1)


def verbosity_of(verbose: bool, quiet: bool = False) -> int:
    return VERBOSE if verbose else QUIET if quiet else NORMAL


def settings_from(overrides: dict):
    """Settings from the flags given (None: not given) over the environment; exit 2 naming a bad one."""
    from orchestrator import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: invalid setting {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


def fail(exc: Exception, output: Path) -> NoReturn:
    """An ordinary failure of a command on an output folder as one line and its exit code: a usage error 2;
    a full disk 5 (as `process` stops: what could not be written, the space left); a damaged file of the
    folder, an unreadable or unwritable one 1. Anything else is a bug: its traceback is kept."""
    from contracts.errors import PipelineError, SettingsError
    from contracts.io import is_disk_full
    from orchestrator.run.report import disk_line

    if isinstance(exc, SettingsError):
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    if is_disk_full(exc):
        typer.echo(f"STOPPED disk full: {disk_line(exc, output)}", err=True)
        raise typer.Exit(ExitCode.DISK_FULL) from None
    if isinstance(exc, OSError):
        typer.echo(f"error: {exc.strerror or exc}: {exc.filename or output}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    if isinstance(exc, PipelineError):
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    raise exc
