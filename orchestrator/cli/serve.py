"""``pipeline serve``: the HTTP API."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from contracts import ExitCode
from orchestrator.cli.common import NORMAL, VERBOSE, setup_logging


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to bind [env PIPELINE_HOST, default 127.0.0.1]; any other than loopback needs a token."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="[env PIPELINE_PORT, default 8000]")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help=(
                "Require 'Authorization: Bearer TOKEN' on every request but /health. Visible to "
                "every user in the process list: prefer PIPELINE_API_TOKEN or --token-file."
            )
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="Read the bearer token from this file (first line) [or env PIPELINE_API_TOKEN]."),
    ] = None,
    input_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--input-root",
            help=(
                "Directory jobs may read from (repeatable) [env PIPELINE_INPUT_ROOTS, "
                "':'-separated]; none: jobs are refused."
            ),
        ),
    ] = None,
    search_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--search-root",
            help=(
                "Output folder POST /v1/search and the page at / search, its files served under "
                "/outputs/<n>/ (repeatable) [env PIPELINE_SEARCH_ROOTS, ':'-separated]."
            ),
        ),
    ] = None,
    server_dir: Annotated[
        Path | None,
        typer.Option(
            help=(
                "Job state, job outputs and worker logs [env PIPELINE_SERVER_DIR, default: a "
                "per-user state directory]."
            )
        ),
    ] = None,
    embedding_profile: Annotated[
        str | None, typer.Option(help="Embedding profile of jobs [env EMBEDDING_PROFILE].")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream every log line, the workers' too.")
    ] = False,
) -> None:
    """HTTP API: OpenAI-compatible POST /v1/embeddings and /v1/audio/transcriptions, POST/GET/DELETE /v1/jobs,
    POST /v1/search and its page at /, GET /health, GET /metrics. One server per --server-dir (a second one
    exits 2 naming the first)."""
    from contracts.errors import SettingsError
    from orchestrator import Settings
    from orchestrator.api.server import serve as run_server

    setup_logging(VERBOSE if verbose else NORMAL)
    logging.getLogger("orchestrator.api").setLevel(logging.INFO)  # a server's log: requests, workers, jobs
    if token_file is not None:
        try:
            lines = token_file.read_text().strip().splitlines()
            token = lines[0].strip() if lines else ""
        except OSError as exc:
            typer.echo(f"error: cannot read the token file {token_file}: {exc.strerror}", err=True)
            raise typer.Exit(ExitCode.USAGE) from None
        if not token:
            typer.echo(f"error: the token file {token_file} is empty", err=True)
            raise typer.Exit(ExitCode.USAGE)
    overrides = {
        "host": host,
        "port": port,
        "api_token": token,
        "input_roots": input_root,
        "search_roots": search_root,
        "server_dir": server_dir,
        "embedding_profile": embedding_profile,
    }
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        settings.check_serve()
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: invalid setting {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    try:
        run_server(settings)
    except SettingsError as exc:  # e.g. another server owns the state folder (it is named)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
