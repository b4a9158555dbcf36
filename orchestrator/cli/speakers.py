"""``pipeline enroll NAME CLIP...`` (a voice profile) and ``pipeline speakers cluster|list|name|merge|split
OUT`` (the corpus speakers of an output folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from contracts import ExitCode
from orchestrator.cli.common import OutArg, WaitOpt, fail, settings_from, setup_logging, verbosity_of


def enroll(
    name: Annotated[
        str,
        typer.Argument(help="The speaker's name, as it should appear in transcripts.", show_default=False),
    ],
    clips: Annotated[
        list[Path], typer.Argument(help="Audio/video clips of this speaker alone.", show_default=False)
    ],
    profiles: Annotated[
        Path | None,
        typer.Option(
            "--profiles", help="Profiles directory [env PIPELINE_PROFILES_DIR, default ./profiles]."
        ),
    ] = None,
    encoder: Annotated[
        str | None, typer.Option(help="campplus (embedded) or ecapa [env SPEAKER_ENCODER].")
    ] = None,
    threshold: Annotated[
        float | None, typer.Option(help="Similarity needed to give this name [env SPEAKER_THRESHOLD].")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream every log line, the stage child's too.")
    ] = False,
) -> None:
    """Build a voice profile NAME from CLIPS (its own stage child); `process --profiles DIR` then names the speaker."""
    from orchestrator import Settings
    from orchestrator.run.enroll import enroll as run_enroll

    setup_logging(verbosity_of(verbose))
    overrides = {"speaker_encoder": encoder, "speaker_threshold": threshold, "profiles_dir": profiles}
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        if settings.profiles_dir is None:
            settings = settings.replace(profiles_dir=Path("profiles"))
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: invalid setting {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    from contracts.errors import InputError, PipelineError, SettingsError

    try:
        path = run_enroll(settings, name, clips)
    except (SettingsError, InputError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    except PipelineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    typer.echo(f"enrolled {name}: {path}", err=True)


speakers_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Corpus speakers: one voice, one id (S0001, ...) across an output folder.",
)


def _speakers_call(output: Path, verbose: bool, call, relabels: bool = True, **overrides):
    """Run ``call(settings, output)``; a failure is one line and its exit code (:func:`fail`)."""
    setup_logging(verbosity_of(verbose))
    if not output.is_dir():
        typer.echo(f"error: {output} is not a directory", err=True)
        raise typer.Exit(ExitCode.USAGE)
    settings = settings_from({"output_dir": output, **overrides})
    try:
        result = call(settings, output)
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        fail(exc, output)
    if relabels:
        _relabel_catalogue(output)
    return settings, result


def _relabel_catalogue(output: Path) -> None:
    """The catalogue's speakers made what the files now show (a warning if it cannot be: the files are the
    truth, and `pipeline index` repairs it)."""
    from orchestrator.catalogue.sync import relabel

    try:
        result = relabel(output)
    except Exception as exc:  # noqa: BLE001 - the command itself succeeded
        typer.echo(f"WARNING the catalogue was not updated ({exc}): run `pipeline index {output}`", err=True)
        return
    if result.indexed:
        typer.echo(f"catalogue: {result.indexed} inputs relabelled", err=True)


@speakers_app.command("cluster")
def speakers_cluster(
    output: OutArg,
    distance: Annotated[
        float | None,
        typer.Option(
            help=(
                "Cosine distance under which a voice joins a corpus speaker [env "
                "CORPUS_SPEAKER_DISTANCE, default 0.3]."
            )
        ),
    ] = None,
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Place the speakers of every input not placed yet into corpus speakers (OUT/speakers.json) and write
    their files again; starts no model child. `process` does this after each chunk."""
    from orchestrator.corpus.speakers import cluster

    _, placed = _speakers_call(
        output, verbose, cluster, corpus_speaker_distance=distance, wait_for_output=wait or None
    )
    typer.echo(
        f"{len(placed.corpus.speakers)} corpus speakers ({len(placed.new_speakers)} new); "
        f"{len(placed.changed)} inputs' files written again",
        err=True,
    )


@speakers_app.command("list")
def speakers_list(
    output: OutArg,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Each corpus speaker: inputs, speaking time, and its longest turn alone (a file and times to listen to)."""
    import dataclasses
    import json

    from orchestrator.corpus.speakers import summaries

    _, rows = _speakers_call(output, verbose, lambda settings, out: summaries(out), relabels=False)
    if json_out:
        typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=1, ensure_ascii=False))
        return
    for r in rows:
        turn = f"{r.clean_turn[1]} {r.clean_turn[2]:.2f}-{r.clean_turn[3]:.2f} s" if r.clean_turn else "-"
        shown = f"{r.id} {r.label}" if r.label != r.id else r.id
        typer.echo(f"{shown}\t{r.inputs} inputs\t{r.seconds:.1f} s\tlongest alone: {turn}")


@speakers_app.command("name")
def speakers_name(
    output: OutArg,
    speaker: Annotated[str, typer.Argument(help="The corpus speaker (S0007).", show_default=False)],
    name: Annotated[str, typer.Argument(help="Its name, as transcripts should show it.", show_default=False)],
    profiles: Annotated[
        Path | None,
        typer.Option(
            "--profiles",
            help="Where its voice profile is written [env PIPELINE_PROFILES_DIR, default ./profiles].",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace another voice profile of this name (an enrolled one, another folder's speaker's).",
        ),
    ] = False,
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Name a corpus speaker in every file of the folder at once (no model runs) and write its voice profile,
    so that `process --profiles DIR` names that voice in new inputs too. Another profile of that name is
    replaced only with --force (else exit 2, naming it); the speaker's profile under a former name goes."""
    from orchestrator.corpus.speakers import name as run_name

    def call(settings, out):
        if settings.profiles_dir is None:
            settings = settings.replace(profiles_dir=Path("profiles"))
        return run_name(settings, out, speaker, name, force=force)

    _, named = _speakers_call(output, verbose, call, profiles_dir=profiles, wait_for_output=wait or None)
    for path in named.replaced:
        typer.echo(f"REPLACED voice profile {path}", err=True)
    typer.echo(
        f"{named.speaker.id} is {named.speaker.name}: {named.rewritten} inputs' files written again; "
        f"voice profile {named.profile}",
        err=True,
    )


@speakers_app.command("merge")
def speakers_merge(
    output: OutArg,
    keep: Annotated[str, typer.Argument(help="The corpus speaker that stays (S0007).", show_default=False)],
    other: Annotated[str, typer.Argument(help="The one merged into it (S0012).", show_default=False)],
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Two corpus speakers are one voice: OTHER's inputs become KEEP's, in every file."""
    from orchestrator.corpus.speakers import merge

    _, merged = _speakers_call(
        output, verbose, lambda settings, out: merge(settings, out, keep, other), wait_for_output=wait or None
    )
    typer.echo(
        f"{other} merged into {merged.id}: {len({m.item_id for m in merged.members})} inputs", err=True
    )


@speakers_app.command("split")
def speakers_split(
    output: OutArg,
    speaker: Annotated[str, typer.Argument(help="The corpus speaker to split (S0007).", show_default=False)],
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            help="An input (id) whose speaker is another voice; repeatable [default: group its voices again].",
        ),
    ] = None,
    distance: Annotated[
        float | None,
        typer.Option(
            help=(
                "Without --input: the distance its voices are grouped at again [default: half of "
                "CORPUS_SPEAKER_DISTANCE]."
            )
        ),
    ] = None,
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """A wrong merge mended: the speakers of these inputs (or the voices that group apart) leave SPEAKER and
    become new corpus speakers."""
    from orchestrator.corpus.speakers import split

    _, new = _speakers_call(
        output,
        verbose,
        lambda settings, out: split(settings, out, speaker, inputs, distance),
        wait_for_output=wait or None,
    )
    for s in new:
        typer.echo(
            f"{s.id}: {len(s.members)} speaker(s) of {', '.join(sorted({m.item_id for m in s.members}))} "
            f"split from {speaker}",
            err=True,
        )
