"""``pipeline models list|pull|verify``: the models the settings need, for air-gapped machines."""

from __future__ import annotations

from typing import Annotated

import typer

from contracts import ExitCode
from orchestrator.cli.common import settings_from, setup_logging, verbosity_of

models_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The models the settings need, for air-gapped machines: list them, pull them, verify the cache.",
)

ModelAsrOpt = Annotated[
    str | None, typer.Option("--asr-model", help="A Whisper name, hub id or folder [env ASR_MODEL].")
]
ModelProfileOpt = Annotated[
    str | None, typer.Option(help="speed, quality, embedded or a model name [env EMBEDDING_PROFILE].")
]
ModelDiarizationOpt = Annotated[
    str | None, typer.Option(help="auto, embedded or a pyannote pipeline [env DIARIZATION_MODEL].")
]
ModelEncoderOpt = Annotated[str | None, typer.Option(help="campplus or ecapa [env SPEAKER_ENCODER].")]
ModelLanguagesOpt = Annotated[
    str | None, typer.Option(help="Languages whose hub aligners are needed, e.g. nl,pt [env ASR_LANGUAGES].")
]


def _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, allow_hub):
    """The settings' models (``orchestrator.models.cache.model_rows``), ``allow_hub`` resolved as `process`
    resolves it."""
    from contracts.errors import SettingsError
    from orchestrator.models.cache import model_rows
    from orchestrator.models.hub import resolve_hub

    settings = settings_from(
        {
            "asr_model": asr_model,
            "embedding_profile": embedding_profile,
            "diarization_model": diarization_model,
            "speaker_encoder": speaker_encoder,
            "asr_languages": languages,
            "allow_hub": allow_hub,
        }
    )
    try:
        return model_rows(resolve_hub(settings))
    except (SettingsError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


@models_app.command("list")
def models_list(
    asr_model: ModelAsrOpt = None,
    embedding_profile: ModelProfileOpt = None,
    diarization_model: ModelDiarizationOpt = None,
    speaker_encoder: ModelEncoderOpt = None,
    languages: ModelLanguagesOpt = None,
    allow_hub: Annotated[
        bool | None, typer.Option("--allow-hub/--offline", help="[env PIPELINE_ALLOW_HUB, default auto]")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Per stage (`process`'s, and `enroll`'s encoder): the model the settings ask for, whether the Hugging
    Face cache holds it (which revision) or it is embedded, and what would run now (the model, or the
    embedded fallback and why)."""
    import dataclasses
    import json

    setup_logging(verbosity_of(verbose))
    rows = _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, allow_hub)
    if json_out:
        fields = ("stage", "repo", "revision", "cached", "runs", "fallback_reason", "terms")
        typer.echo(json.dumps([{k: dataclasses.asdict(r)[k] for k in fields} for r in rows], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    def short(name: str) -> str:  # a commit id's first 12 digits, as git shows it (--json: whole)
        head, at, revision = name.partition("@")
        return f"{head}@{revision[:12]}" if at and len(revision) == 40 else name

    table = Table()
    for column in (
        "stage",
        "asks for",
        "cached",
        "runs now",
        "why not the model asked for",
        "licence / gate",
    ):
        table.add_column(column, overflow="fold")
    for r in rows:
        asked = f"{r.repo}@{r.revision}" if r.revision else r.repo
        cached = "no" if r.cached is None else r.cached[:12]
        table.add_row(r.stage, asked, cached, short(r.runs), r.fallback_reason or "-", r.terms or "-")
    Console(width=200).print(table)


@models_app.command("pull")
def models_pull(
    asr_model: ModelAsrOpt = None,
    embedding_profile: ModelProfileOpt = None,
    diarization_model: ModelDiarizationOpt = None,
    speaker_encoder: ModelEncoderOpt = None,
    languages: ModelLanguagesOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """On a machine that reaches the hub: fetch every model these settings need into the Hugging Face cache
    (HF_HOME), resuming an earlier pull; HF_TOKEN for gated models. Carry HF_HOME to the offline machine."""
    from orchestrator.models.cache import PullError, pull

    setup_logging(verbosity_of(verbose))
    rows = _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, False)
    summary: list[str] = []  # one line per model, after huggingface_hub's progress bars
    for row in rows:
        if row.local:
            summary.append(
                f"local {row.stage}: {row.repo} is a folder on this machine: carry it yourself"
                if row.cached
                else f"FAILED {row.stage}: {row.repo}: {row.fallback_reason}"
            )
            continue
        if row.source == "torch":
            summary.append(
                f"skipped {row.stage}: {row.repo} is torchaudio's, not a hub model: a run that reaches "
                "download.pytorch.org fetches it into $TORCH_HOME/hub/checkpoints; carry that file"
            )
            continue
        if not row.hub:  # embedded: ships with the project
            continue
        try:
            summary.append(f"pulled {pull(row)}")
        except PullError as exc:
            summary.append(f"FAILED {row.stage}: {exc}")
        except KeyboardInterrupt:
            typer.echo("\n".join([*summary, "interrupted: rerun the same command to resume"]), err=True)
            raise typer.Exit(ExitCode.INTERRUPTED) from None
    for line in summary:
        typer.echo(line, err=True)
    failed = any(line.startswith("FAILED") for line in summary)
    raise typer.Exit(ExitCode.FAILED if failed else ExitCode.OK)


@models_app.command("verify")
def models_verify(
    asr_model: ModelAsrOpt = None,
    embedding_profile: ModelProfileOpt = None,
    diarization_model: ModelDiarizationOpt = None,
    speaker_encoder: ModelEncoderOpt = None,
    languages: ModelLanguagesOpt = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every model of the cache, not the settings' only.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Check each cached model of the settings: every file its stage loads is there, and every file's hash
    matches its blob's name (sha256 / git sha1). Names the missing, corrupt and unhashable files; exit 1
    when any is, or (--all) when nothing is cached."""
    from huggingface_hub import constants

    from contracts.snapshots import STAGE_KINDS
    from orchestrator.models.cache import cached_repo_ids, verify

    setup_logging(verbosity_of(verbose))
    if every:
        repos = {repo: None for repo in cached_repo_ids()}
        if not repos:
            typer.echo(f"nothing cached: no model in {constants.HF_HUB_CACHE} (is HF_HOME set?)", err=True)
            raise typer.Exit(ExitCode.FAILED)
    else:
        rows = _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, False)
        repos = {r.repo: STAGE_KINDS.get(r.stage.split(", ", 1)[0]) for r in rows if r.hub}
        if not repos:
            typer.echo("no model of these settings comes from the hub: nothing to verify", err=True)
            raise typer.Exit(ExitCode.OK)
    bad = 0
    for repo, kind in repos.items():
        check = verify(repo, kind=kind)
        for problem in check.problems:
            typer.echo(f"BAD {repo}: {problem}", err=True)
        for file in check.unhashed:
            typer.echo(f"UNHASHED {repo}: {file}", err=True)
        if check.problems or check.unhashed:
            bad += 1
        else:
            typer.echo(f"ok {repo}@{check.revision} ({check.files} files)", err=True)
    raise typer.Exit(ExitCode.FAILED if bad else ExitCode.OK)
