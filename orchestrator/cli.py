"""``pipeline``: the command line. Settings are read here, once, and passed down."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from contracts import ExitCode

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Subprocess-isolated GPU transcription pipeline.",
)
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


def _verbosity(verbose: bool, quiet: bool = False) -> int:
    return VERBOSE if verbose else QUIET if quiet else NORMAL


def _batch(value: str | None, option: str) -> int | str | None:
    """A batch size flag: a positive number or "auto" (sized from the GPU's free memory)."""
    if value is None or value == "auto":
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise typer.BadParameter(f"{value!r} is neither a positive number nor 'auto'", param_hint=option)


def _settings(overrides: dict):
    """Settings from the flags given (None: not given) over the environment; exit 2 naming a bad one."""
    from orchestrator import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: invalid setting {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(ExitCode.USAGE) from None


def _stopped_code(orch) -> ExitCode:
    """130 after Ctrl-C, 143 after SIGTERM (as shells and service managers expect)."""
    import signal

    return (
        ExitCode.TERMINATED
        if orch is not None and orch.stopped_by == signal.SIGTERM
        else ExitCode.INTERRUPTED
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


@app.command()
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

    console = Console(stderr=True)
    verbosity = _verbosity(verbose, quiet)
    setup_logging(verbosity, console)
    asr_batch_size = _batch(asr_batch_size, "--asr-batch-size")
    embedding_batch_size = _batch(embedding_batch_size, "--embedding-batch-size")
    overrides = {
        "output_dir": None if output is None or is_url(output) else Path(output),
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
        "langid_only": langid_only or None,
    }
    settings = _settings(overrides)
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
    for line in report.downloads + report.substitutions:
        typer.echo(f"NOTE {line}", err=True)
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


@app.command()
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


@app.command()
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

    setup_logging(_verbosity(verbose))
    if not output.is_dir():
        typer.echo(f"error: {output} is not a directory", err=True)
        raise typer.Exit(ExitCode.USAGE)
    if formats is not None and formats.strip().lower() == "all":
        formats = ",".join(FORMATS)
    overrides = {"output_dir": output, "export_formats": formats, "wait_for_output": wait or None}
    settings = _settings(overrides)
    try:
        result = run_export(settings, settings.export_formats, inputs)
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        _fail(exc, output)
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


@app.command()
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

    setup_logging(_verbosity(verbose))
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
app.add_typer(speakers_app, name="speakers")

OutArg = Annotated[
    Path, typer.Argument(help="The output directory of earlier `process` runs.", show_default=False)
]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="Wait while a run uses the output directory [env PIPELINE_WAIT].")
]


def _fail(exc: Exception, output: Path) -> NoReturn:
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


def _speakers_call(output: Path, verbose: bool, call, **overrides):
    """Run ``call(settings, output)``; a failure is one line and its exit code (:func:`_fail`)."""
    setup_logging(_verbosity(verbose))
    if not output.is_dir():
        typer.echo(f"error: {output} is not a directory", err=True)
        raise typer.Exit(ExitCode.USAGE)
    settings = _settings({"output_dir": output, **overrides})
    try:
        return settings, call(settings, output)
    except Exception as exc:  # noqa: BLE001 - each ordinary failure is one line and its exit code
        _fail(exc, output)


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

    _, rows = _speakers_call(output, verbose, lambda settings, out: summaries(out))
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


@app.command()
def gpu(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    cleanup: Annotated[
        bool,
        typer.Option(
            "--cleanup",
            help="Stop this project's orphaned stage children (pid files with start times, never by name).",
        ),
    ] = False,
    pid_dir: Annotated[
        Path | None, typer.Option(help="Pid files of stage children [env PIPELINE_PID_DIR].")
    ] = None,
) -> None:
    """GPU devices and the processes holding VRAM (NVML: no CUDA context); exit 0 also without a GPU."""
    import json

    from rich.console import Console

    from orchestrator import Settings
    from orchestrator.gpu.nvml import NvmlReader
    from orchestrator.process.gpu_status import as_json, render, render_cleanup
    from orchestrator.process.pidfiles import ChildRegistry

    setup_logging(NORMAL)
    registry = ChildRegistry(pid_dir or Settings().pid_dir)
    done = registry.cleanup() if cleanup else None
    snapshot = NvmlReader().read()
    if json_out:
        typer.echo(json.dumps(as_json(snapshot, registry, done), indent=2))
        return
    console = Console(soft_wrap=True)
    console.print(render(snapshot, registry))
    if done is not None:
        console.print(render_cleanup(done, registry))


@app.command()
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
    from orchestrator.telemetry.perf_report import build, table

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
    console.print(f"log: {built.log}\nplot: {built.png}")


@app.command()
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
    GET /health, GET /metrics. One server per --server-dir (a second one exits 2 naming the first)."""
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


models_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The models the settings need, for air-gapped machines: list them, pull them, verify the cache.",
)
app.add_typer(models_app, name="models")

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
    """The settings' models (``orchestrator.run.offline.model_rows``), ``allow_hub`` resolved as `process`
    resolves it."""
    from contracts.errors import SettingsError
    from orchestrator.models.cache import model_rows
    from orchestrator.models.hub import resolve_hub

    settings = _settings(
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
    """Per stage: the model the settings ask for, whether the Hugging Face cache holds it (which revision),
    and what `process` would run now (the model, or the embedded fallback and why)."""
    import dataclasses
    import json

    setup_logging(_verbosity(verbose))
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

    table = Table(title=None if rows else "no stage of these settings needs a hub model")
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
        asked = r.repo if r.local else f"{r.repo}@{r.revision}"
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

    setup_logging(_verbosity(verbose))
    rows = _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, False)
    summary: list[str] = []  # one line per model, after huggingface_hub's progress bars
    for row in rows:
        if row.local:
            summary.append(f"local {row.stage}: {row.repo} is a folder on this machine: carry it yourself")
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
    """Hash every cached file of the settings' models against its blob's name (sha256 / git sha1); name the
    missing and corrupt ones. Exit 1 when any is bad."""
    from orchestrator.models.cache import cached_repo_ids, verify

    setup_logging(_verbosity(verbose))
    if every:
        repos = cached_repo_ids()
    else:
        rows = _model_rows(asr_model, embedding_profile, diarization_model, speaker_encoder, languages, False)
        repos = [r.repo for r in rows if not r.local]
    bad = 0
    for repo in repos:
        check = verify(repo)
        if check.problems:
            bad += 1
            for problem in check.problems:
                typer.echo(f"BAD {repo}: {problem}", err=True)
        else:
            typer.echo(f"ok {repo}@{check.revision} ({check.files} files)", err=True)
    raise typer.Exit(ExitCode.FAILED if bad else ExitCode.OK)


def main() -> None:
    import signal

    # a file size limit (ulimit -f) makes writes fail with a clear error instead of killing the run
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    app(prog_name="pipeline")


if __name__ == "__main__":
    main()
