"""``pipeline process`` (and its ``--dry-run``) and ``pipeline langid``, which runs `process`'s machinery
with ``--langid-only``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from contracts import ExitCode
from orchestrator.cli.common import (
    QUIET,
    ChunkSizeOpt,
    DeviceOpt,
    ForceOpt,
    OutputOpt,
    QuietOpt,
    RunVerboseOpt,
    RunWaitOpt,
    settings_from,
    setup_logging,
    verbosity_of,
)


def _batch(value: str | None, option: str) -> int | str | None:
    """A batch size flag: a positive number or "auto" (sized from the GPU's free memory)."""
    if value is None or value == "auto":
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise typer.BadParameter(f"{value!r} is neither a positive number nor 'auto'", param_hint=option)


def _stopped_code(orch) -> ExitCode:
    """130 after Ctrl-C, 143 after SIGTERM (as shells and service managers expect)."""
    import signal

    return (
        ExitCode.TERMINATED
        if orch is not None and orch.stopped_by == signal.SIGTERM
        else ExitCode.INTERRUPTED
    )


def process(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="Video/audio files or directories, local or fsspec URLs (s3://, sftp://, file://).",
            show_default=False,
        ),
    ],
    output: OutputOpt = None,
    device: DeviceOpt = None,
    asr_model: Annotated[
        str | None,
        typer.Option(
            help=(
                "'embedded' (English tiny.en), 'whisper-base' (multilingual, embedded), a "
                "CTranslate2 directory or a model name [env ASR_MODEL]."
            )
        ),
    ] = None,
    language: Annotated[
        str | None,
        typer.Option(help="Spoken language code: forces it, no identification [env ASR_LANGUAGE]."),
    ] = None,
    languages: Annotated[
        str | None,
        typer.Option(help="Languages identification may choose from, e.g. en,de,es [env ASR_LANGUAGES]."),
    ] = None,
    prompt: Annotated[
        str | None,
        typer.Option(help="Whisper's initial prompt: vocabulary, spelling, style [env ASR_PROMPT]."),
    ] = None,
    translate: Annotated[
        bool,
        typer.Option(
            "--translate",
            help=(
                "Also translate every input not in English into English: transcript.en.* beside the "
                "original (needs a multilingual model) [env ASR_TRANSLATE]."
            ),
        ),
    ] = False,
    hotwords: Annotated[
        str | None,
        typer.Option(
            help=(
                "Names and terms for every input, comma-separated; each folder's vocabulary.txt and each "
                "<input>.vocabulary.txt add theirs [env ASR_HOTWORDS]."
            )
        ),
    ] = None,
    asr_batch_size: Annotated[
        str | None, typer.Option(help="A number or auto [env ASR_BATCH_SIZE, default 16].")
    ] = None,
    embedding_profile: Annotated[
        str | None, typer.Option(help="speed, quality, embedded or a model name [env EMBEDDING_PROFILE].")
    ] = None,
    embedding_batch_size: Annotated[
        str | None, typer.Option(help="A number or auto [env EMBEDDING_BATCH_SIZE, default 128].")
    ] = None,
    allow_hub: Annotated[
        bool | None,
        typer.Option(
            "--allow-hub/--offline",
            help=(
                "Allow or forbid model downloads; unset: allowed when the hub answers [env "
                "PIPELINE_ALLOW_HUB, default auto]."
            ),
        ),
    ] = None,
    chunk_size: ChunkSizeOpt = None,
    speakers: Annotated[
        bool | None,
        typer.Option(
            "--speakers/--no-speakers", help="Diarize and label speakers [env PIPELINE_SPEAKERS, default on]."
        ),
    ] = None,
    profiles: Annotated[
        Path | None,
        typer.Option(
            "--profiles",
            help="Voice profiles to name speakers with (pipeline enroll) [env PIPELINE_PROFILES_DIR].",
        ),
    ] = None,
    min_speakers: Annotated[int | None, typer.Option(min=1, help="[env MIN_SPEAKERS]")] = None,
    max_speakers: Annotated[int | None, typer.Option(min=1, help="[env MAX_SPEAKERS]")] = None,
    executor: Annotated[
        str | None, typer.Option(help="local or ray [env PIPELINE_EXECUTOR, default local].")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Ray cluster: auto or HOST:PORT; unset: a local one for this run [env RAY_ADDRESS]."
        ),
    ] = None,
    parallel_chunks: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Chunks in flight [env PIPELINE_PARALLEL_CHUNKS; default 1 locally, the cluster's GPUs under Ray].",
        ),
    ] = None,
    force: ForceOpt = False,
    on_damaged: Annotated[
        str | None,
        typer.Option(
            help=(
                "A source damaged part-way: keep what decoded (reported partial) or fail it [env "
                "PIPELINE_ON_DAMAGED, default keep]."
            )
        ),
    ] = None,
    channels: Annotated[
        str | None,
        typer.Option(
            help=(
                "A source's channels: mix them to mono, transcribe each as its own speaker (separate), or "
                "separate only when they hold different speech (auto) [env PIPELINE_CHANNELS, default mix]."
            )
        ),
    ] = None,
    channel_names: Annotated[
        str | None,
        typer.Option(
            help=(
                "Separated channels' speaker names, in channel order, e.g. agent,customer [env "
                "PIPELINE_CHANNEL_NAMES, default 'channel 1', 'channel 2', ...]."
            )
        ),
    ] = None,
    wait: RunWaitOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help=(
                "Plan only: per stage, how many inputs would be reused and redone, and why. Starts "
                "no child, writes nothing."
            ),
        ),
    ] = False,
    verbose: RunVerboseOpt = False,
    quiet: QuietOpt = False,
    langid_only: Annotated[
        bool, typer.Option("--langid-only", hidden=True, help="What `pipeline langid` runs.")
    ] = False,
) -> None:
    """Transcribe and embed each input; write DIR/<input>/... and DIR/run-report.json."""
    from rich.console import Console

    from orchestrator import Orchestrator
    from orchestrator.remote import is_url
    from orchestrator.run.pipeline import REPORT_NAME
    from orchestrator.run.progress import LogProgress, Progress, RichProgress, summary_table
    from orchestrator.run.report import notes_to_show

    console = Console(stderr=True)
    verbosity = verbosity_of(verbose, quiet)
    setup_logging(verbosity, console)
    asr_batch_size = _batch(asr_batch_size, "--asr-batch-size")
    embedding_batch_size = _batch(embedding_batch_size, "--embedding-batch-size")
    overrides = {
        "output_dir": None if output is None or is_url(output) else output,
        "output_url": output if output is not None and is_url(output) else None,
        "device": device,
        "asr_model": asr_model,
        "asr_language": language,
        "asr_languages": languages,
        "asr_prompt": prompt,
        "asr_hotwords": hotwords,
        "asr_translate": translate or None,
        "asr_batch_size": asr_batch_size,
        "embedding_profile": embedding_profile,
        "embedding_batch_size": embedding_batch_size,
        "allow_hub": allow_hub,
        "chunk_size": chunk_size,
        "force": force or None,
        "speakers": speakers,
        "profiles_dir": profiles,
        "min_speakers": min_speakers,
        "max_speakers": max_speakers,
        "executor": executor,
        "ray_address": ray_address,
        "parallel_chunks": parallel_chunks,
        "wait_for_output": wait or None,
        "on_damaged": on_damaged,
        "channels": channels,
        "channel_names": channel_names,
        "langid_only": langid_only or None,
    }
    settings = settings_from(overrides)
    if verbosity == QUIET:
        progress = Progress()  # counts only
    else:
        progress = RichProgress(console) if console.is_terminal else LogProgress()
    from contracts.errors import SettingsError

    orch = None
    if dry_run:
        from orchestrator.run.progress import plan_lines

        try:
            with Orchestrator(settings) as orch:
                planned = orch.plan(inputs)
        except SettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(ExitCode.USAGE) from None
        for line in plan_lines(planned):
            typer.echo(line)
        raise typer.Exit(ExitCode.OK)
    try:
        with Orchestrator(settings) as orch:
            report = orch.process(inputs, progress=progress)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: stage children stopped; rerun the same command to resume", err=True)
        raise typer.Exit(_stopped_code(orch)) from None
    fresh, said_before = notes_to_show(Path(report.output_dir), report.substitutions)
    for line in report.downloads + fresh:
        typer.echo(f"NOTE {line}", err=True)
    if said_before:
        typer.echo(
            f"NOTE {said_before} model substitution(s) said by an earlier run of this folder still hold "
            "(run-report.json lists them; `pipeline models list` says why)",
            err=True,
        )
    if console.is_terminal:
        console.print(summary_table(report))
    else:
        Console(stderr=True, width=max(console.width, 120)).print(summary_table(report, plain=True))
    for item in report.inputs:
        if item.status == "failed":
            typer.echo(f"FAILED {item.source}: [{item.failed_stage}] {item.error}", err=True)
        elif item.status == "partial":
            typer.echo(f"PARTIAL {item.source}: {item.error}", err=True)
    partial = f", {report.partial} partial" if report.partial else ""
    where = (
        f"the report could not be written ({orch.report_error})"
        if orch.report_error
        else f"report: {Path(report.output_dir) / REPORT_NAME}"
    )
    typer.echo(
        f"{report.ok} ok{partial}, {report.failed} failed, {report.interrupted} interrupted; {where}",
        err=True,
    )
    if settings.langid_only:
        typer.echo(f"languages: {Path(report.output_dir) / 'langid.csv'} and langid.json", err=True)
    if orch.disk_full:
        typer.echo(f"STOPPED disk full: {orch.disk_full}", err=True)
        raise typer.Exit(ExitCode.DISK_FULL)
    if report.interrupted:
        raise typer.Exit(_stopped_code(orch))
    raise typer.Exit(ExitCode.OK if report.failed == 0 else ExitCode.FAILED)


def langid(
    inputs: Annotated[
        list[str],
        typer.Argument(help="Video/audio files or directories, local or fsspec URLs.", show_default=False),
    ],
    output: OutputOpt = None,
    device: DeviceOpt = None,
    asr_model: Annotated[
        str | None,
        typer.Option(
            help=(
                "A multilingual Whisper: 'whisper-base' (embedded, the default here), a "
                "CTranslate2 directory or a model name [env ASR_MODEL]."
            )
        ),
    ] = None,
    languages: Annotated[
        str | None, typer.Option(help="Languages to choose from, e.g. en,de,es [env ASR_LANGUAGES].")
    ] = None,
    chunk_size: ChunkSizeOpt = None,
    parallel_chunks: Annotated[
        int | None, typer.Option(min=1, help="Chunks in flight [env PIPELINE_PARALLEL_CHUNKS].")
    ] = None,
    force: ForceOpt = False,
    wait: RunWaitOpt = False,
    verbose: RunVerboseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Identify each input's language only (decoding + identification, no transcript); write DIR/langid.csv,
    DIR/langid.json and DIR/run-report.json. Same chunks, resume and failure isolation as `process`."""
    import os

    process(
        inputs,
        output=output,
        device=device,
        asr_model=asr_model or os.environ.get("ASR_MODEL") or "whisper-base",
        languages=languages,
        chunk_size=chunk_size,
        parallel_chunks=parallel_chunks,
        force=force,
        wait=wait,
        verbose=verbose,
        quiet=quiet,
        langid_only=True,
    )
