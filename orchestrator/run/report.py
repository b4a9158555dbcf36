"""The run report: built from the inputs' run states and the stage runs, saved (with ``pipeline langid``'s
tables, or the output folder's index), and uploaded where the outputs go."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from contracts import DiarizationArtifact, EmbeddingsArtifact, TranscriptArtifact, save_model
from contracts.errors import DiskFullError
from contracts.io import atomic_write_text, is_disk_full, save_large
from contracts.report import InputReport, RunReport, StageRun
from orchestrator import layout
from orchestrator.planning.state import InputState
from orchestrator.remote import redact, upload
from orchestrator.settings import Settings
from orchestrator.telemetry.timings import computing, exposure

log = logging.getLogger(__name__)

REPORT_NAME = layout.REPORT
#: runs of more inputs than this write their report without indentation
LARGE_REPORT = 1000
LANGID_COLUMNS = ("input", "source", "status", "language", "probability", "speech_s", "top", "reason")


def redacted(settings: dict) -> dict:
    """The settings as the report shows them: the output URL without its password."""
    if settings.get("output_url"):
        settings["output_url"] = redact(settings["output_url"])
    return settings


def build_report(
    settings: Settings,
    run_id: str,
    started: datetime,
    wall_s: float,
    out: Path,
    inputs: list[InputState],
    stage_runs: list[StageRun],
    fetched: list[str],
) -> RunReport:
    """The run's report: one entry per input, the counts, the stage runs, the models substituted.

    Each input's entry shares its run state's values (``model_construct``: no copy of 100,000 inputs'
    outputs, stages and notes); every entry is validated where the report is written
    (``contracts.io.save_large``, ``save_model``)."""
    reports = [
        InputReport.model_construct(
            id=inp.id,
            source=inp.shown,
            status=inp.status,
            error=inp.error or (f"damaged source: {inp.damage}" if inp.damage else None),
            failed_stage=inp.failed_stage,
            duration_s=inp.duration_s,
            outputs=inp.outputs,
            stages=inp.stages,
            notes=inp.notes,
            language=inp.language,
            overlap_s=inp.overlap_s,
        )
        for inp in inputs
    ]
    begun = started.timestamp()
    exposed = exposure(computing(a for run in stage_runs for a in run.attempts), begun, begun + wall_s)
    return RunReport(
        run_id=run_id,
        started_at=started,
        finished_at=datetime.now(UTC),
        output_dir=str(out),
        settings=redacted(settings.model_dump(mode="json")),
        ok=sum(r.status == "ok" for r in reports),
        failed=sum(r.status == "failed" for r in reports),
        interrupted=sum(r.status == "interrupted" for r in reports),
        partial=sum(r.status == "partial" for r in reports),
        chunk_size=settings.chunk_size,
        chunks=-(-len(inputs) // settings.chunk_size),
        audio_s=sum(inp.duration_s or 0.0 for inp in inputs if inp.complete),
        wall_s=wall_s,
        throughput=worked_audio / wall_s
        if (worked_audio := sum(inp.duration_s or 0.0 for inp in inputs if inp.complete and inp.worked))
        and wall_s > 0
        else None,
        computing_s=exposed.computing_s,
        exposed_s=exposed.exposed_s,
        inputs=reports,
        stages=stage_runs,
        substitutions=list(dict.fromkeys(line for inp in inputs for line in inp.substitutions)),
        downloads=fetched,
    )


def save_report(
    settings: Settings,
    report: RunReport,
    out: Path,
    run_dir: Path,
    write_index: Callable[[Path], object] | None = None,
) -> str | None:
    """Write ``report`` to OUT and the run's folder (then ``pipeline langid``'s tables, or the output
    folder's index with ``write_index``), and upload it where the outputs go. Returns why it could not be
    written (a full disk)."""
    error = None
    try:
        if len(report.inputs) <= LARGE_REPORT:
            save_model(report, out / REPORT_NAME, run_dir / REPORT_NAME)
        else:  # compact, one input at a time (100,000 inputs: 196 MB indented, 0.9 GB more to write it whole)
            save_large(report, "inputs", out / REPORT_NAME, run_dir / REPORT_NAME)
        if settings.langid_only:
            write_langid_tables(report, out)
        elif write_index is not None:
            write_index(out)
    except (OSError, DiskFullError) as exc:
        if not is_disk_full(exc):
            raise
        error = disk_line(exc, out)
        log.error("could not write the run report: %s", error)
    if settings.output_url:
        try:
            upload([out / REPORT_NAME], settings.output_url)
        except Exception as exc:  # noqa: BLE001 - the outputs are uploaded; the report stays local
            log.error("could not upload %s to %s: %s", REPORT_NAME, redact(settings.output_url), exc)
    return error


def _short(reason: str | None, limit: int = 100) -> str:
    text = " ".join((reason or "not available").split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def model_substitutions(
    transcript: TranscriptArtifact, embeddings: EmbeddingsArtifact, diarization: DiarizationArtifact | None
) -> list[str]:
    """One line per model this input asked for and did not get: asked for, got, why, how to get it."""
    lines = []
    if embeddings.fallback_reason:
        lines.append(
            f"embeddings: asked for {embeddings.profile!r} ({embeddings.requested_model}), used the embedded "
            f"all-MiniLM-L6-v2: {_short(embeddings.fallback_reason)} To use it: run once with --allow-hub on "
            "a machine that reaches the hub (it is then cached); EMBEDDING_PROFILE=embedded to keep this one"
        )
    if diarization is not None and diarization.fallback_reason:
        lines.append(
            f"diarization: asked for {diarization.requested_model!r}, used {diarization.model}: "
            f"{_short(diarization.fallback_reason)} To use it: accept its conditions on hf.co, set HF_TOKEN "
            "and run once with --allow-hub; DIARIZATION_MODEL=embedded to keep this one"
        )
    words = any(seg.text.strip() or seg.words for seg in transcript.segments)
    if transcript.diarization and not transcript.aligned and words:  # nothing said: nothing to align
        lines.append(
            f"alignment: no word timing ({_short(transcript.alignment_note)}): speakers were labelled from "
            "segment timing. To align words: run once with --allow-hub (the aligner is then cached), or "
            "--no-speakers"
        )
    return lines


def notes_to_show(out: Path, lines: list[str]) -> tuple[list[str], int]:
    """Of a run's model substitution lines (:func:`model_substitutions`), those the console has not said for
    the output folder ``out`` yet, recorded there as said (``OUT/.notes.json``; a substitution is what was
    asked and what ran, the words before its reason); and how many of ``lines`` an earlier run said. The run
    report keeps every one; a folder whose file cannot be read or written says them all again."""
    path = layout.path(out, layout.NOTES)
    try:
        said = set(json.loads(path.read_text())) if path.exists() else set()
    except (OSError, ValueError):
        said = set()
    keys = {line: ": ".join(line.split(": ")[:2]) for line in lines}
    fresh = [line for line in lines if keys[line] not in said]
    if fresh:
        try:
            atomic_write_text(path, json.dumps(sorted(said | set(keys.values())), indent=1))
        except OSError as exc:
            log.warning("the notes said for %s are not recorded: %s", out, exc)
    return fresh, len(lines) - len(fresh)


def disk_line(exc: BaseException, out: Path) -> str:
    """One line for a full disk: what could not be written (and how much, where the writer knew) and the
    free space left on the output directory's filesystem."""
    what = (
        str(exc)
        if isinstance(exc, DiskFullError)
        else f"{exc.strerror or exc}: {getattr(exc, 'filename', '')}"
    )
    try:
        free = shutil.disk_usage(out).free
        where = f"; {free / 2**20:.1f} MiB free on {out}"
    except OSError:
        where = ""
    return f"{' '.join(what.split())}{where}; free some space and run the same command again to resume"


def write_langid_tables(report: RunReport, out: Path) -> tuple[Path, Path]:
    """``pipeline langid``'s table, one row per input: langid.csv and langid.json in ``out`` (atomic writes)."""
    import csv
    import io

    rows = []
    for item in report.inputs:
        found = item.language
        rows.append(
            {
                "input": item.id,
                "source": item.source,
                "status": found.status if found else item.status,
                "language": found.language if found else None,
                "probability": found.probability if found else None,
                "speech_s": found.speech_s if found else None,
                "top": " ".join(f"{s.language}:{s.probability:.3f}" for s in found.top) if found else "",
                "reason": (found.reason if found else item.error) or "",
            }
        )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=LANGID_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    csv_path, json_path = layout.path(out, layout.LANGID_CSV), layout.path(out, layout.LANGID_JSON)
    atomic_write_text(csv_path, buffer.getvalue())
    atomic_write_text(json_path, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return csv_path, json_path
