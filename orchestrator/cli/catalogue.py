"""``pipeline index OUT`` and ``pipeline search OUT "query"``: the corpus catalogue."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from contracts import ExitCode
from orchestrator.cli.common import NORMAL, OutArg, WaitOpt, fail, settings_from, setup_logging


def _copied(url: str, settings) -> Path:
    """The catalogue at ``url`` copied into this machine's cache (``PIPELINE_STAGING_DIR/catalogues/``; only
    what is new since the last copy); its folder. A URL that cannot be read is one line, exit 2."""
    from orchestrator.catalogue.mirror import cache_dir, pull
    from orchestrator.remote import redact

    folder = cache_dir(url, Path(settings.staging_dir))
    try:
        return pull(url, folder)
    except Exception as exc:  # noqa: BLE001 - any protocol's failure: one line
        typer.echo(
            f"error: cannot copy the catalogue of {redact(url)}: {' '.join(str(exc).split())[:300]}", err=True
        )
        raise typer.Exit(ExitCode.USAGE) from None


def index(
    output: OutArg,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Make the catalogue again from the artifacts alone.")
    ] = False,
    wait: WaitOpt = False,
) -> None:
    """Bring OUT's corpus catalogue (OUT/.catalogue: segments with their text, speakers, languages and
    vectors) in line with its files: the inputs the journal calls complete and the catalogue does not hold as
    they are now are indexed from their artifacts, the others dropped. A run does this as it goes; this
    repairs, or with --rebuild makes it again. Starts no model child. Exit 1: an input could not be indexed."""
    from orchestrator.books.lock import OutputLock
    from orchestrator.catalogue.sync import sync

    setup_logging(NORMAL)
    settings = settings_from({"output_dir": output, "wait_for_output": wait or None})
    try:
        with OutputLock(output, wait=settings.wait_for_output, existing=True):
            result = sync(output, rebuild=rebuild)
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        fail(exc, output)
    for item_id, why in result.failed.items():
        typer.echo(f"FAILED {item_id}: {why}", err=True)
    typer.echo(
        f"catalogue: {result.indexed} indexed, {result.unchanged} unchanged, {result.dropped} dropped"
        f"{f', {len(result.failed)} failed' if result.failed else ''} in {result.seconds:.1f} s",
        err=True,
    )
    raise typer.Exit(ExitCode.FAILED if result.failed else ExitCode.OK)


def search(
    output: Annotated[
        str,
        typer.Argument(
            help="The output directory of earlier `process` runs, or the URL their outputs went to "
            "(s3://bucket/out: its catalogue is copied into a local cache first).",
            show_default=False,
        ),
    ],
    query: Annotated[str, typer.Argument(help="What to look for.", show_default=False)],
    mode: Annotated[
        str, typer.Option(help="words (full text), meaning (vectors) or hybrid (both, fused by rank).")
    ] = "hybrid",
    speaker: Annotated[
        str | None, typer.Option(help="Only this speaker: a corpus id (S0001) or the name shown.")
    ] = None,
    language: Annotated[
        str | None, typer.Option(help="Only segments in this language (en, de, ...).")
    ] = None,
    under: Annotated[str | None, typer.Option(help="Only inputs under this folder of ids.")] = None,
    input_id: Annotated[str | None, typer.Option("--input", help="Only this input (its id).")] = None,
    k: Annotated[int, typer.Option("-k", min=1, max=1000, help="How many results.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    embedding_profile: Annotated[
        str | None,
        typer.Option(help="The embeddings model of the query [default: env EMBEDDING_PROFILE, else speed]."),
    ] = None,
) -> None:
    """Search OUT's segments by words, meaning or both. The query is embedded (as a query) by the embeddings
    model the settings name, in a worker child; only vectors of that model are compared, and the inputs
    indexed with another are counted. Each result: the input, its times, the speaker, the text with the
    query's words marked, the score and the transcript page at that moment. Exit 1: no catalogue."""
    from orchestrator.catalogue.query import QueryError, embed_query
    from orchestrator.catalogue.search import MODES, Filters, SearchError
    from orchestrator.catalogue.search import search as run_search
    from orchestrator.remote import is_url

    setup_logging(NORMAL)
    if mode not in MODES:
        typer.echo(f"error: --mode must be one of {', '.join(MODES)}, not {mode!r}", err=True)
        raise typer.Exit(ExitCode.USAGE)
    url = output.rstrip("/") if is_url(output) else None
    settings = settings_from({"embedding_profile": embedding_profile})
    if url is not None:
        output = _copied(url, settings)
    else:
        output = Path(output)
        if not output.is_dir():
            typer.echo(f"error: {output} is not a directory", err=True)
            raise typer.Exit(ExitCode.USAGE)
    settings = settings.replace(output_dir=output)
    filters = Filters(speaker=speaker, language=language, under=under, input=input_id)
    runs = output / ".runs"
    try:
        result = run_search(
            output,
            query,
            (lambda text: embed_query(settings, text, runs)),
            mode=mode,  # type: ignore[arg-type]
            k=k,
            filters=filters,
        )
    except (SearchError, QueryError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        fail(exc, output)
    if as_json:
        payload = {**asdict(result), "hits": [hit.model_dump() for hit in result.hits]}
        typer.echo(json.dumps(payload, ensure_ascii=False, indent=1))
        raise typer.Exit(ExitCode.OK)
    for n, hit in enumerate(result.hits, start=1):
        who = f" {hit.speaker}" if hit.speaker else ""
        typer.echo(f"{n:>2}. {hit.input} {hit.start:.1f}-{hit.end:.1f} s{who} ({hit.score:.3f})")
        typer.echo(f"    {hit.marked}")
        typer.echo(f"    {f'{url}/{hit.link}' if url else output / hit.link}")
    searched = f"{result.indexed - result.unsearched} of {result.indexed} inputs"
    note = (
        f"; {result.unsearched} indexed with another embeddings model not searched by meaning"
        if result.unsearched
        else ""
    )
    model = f" by {result.model}" if result.model else ""
    typer.echo(
        f"{len(result.hits)} results ({result.mode}{model}) in {searched}, {result.seconds:.1f} s{note}",
        err=True,
    )
    raise typer.Exit(ExitCode.OK)
