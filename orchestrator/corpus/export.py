"""``pipeline export``: every format written again from the stored artifacts, starting no child.

An input's files are made from its final ``transcript.json``, its ``diarization.json`` and
``speaker_embeddings.json`` when there are some (who spoke when, and the names profiles gave), the
run's notes the journal kept for it, and the current caption settings. The output folder's index
(``OUT/index.html``) is written again too, from the journal: every input with its status and links.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from contracts import DiarizationArtifact, TranscriptArtifact, load_artifact
from contracts.artifacts import SpeakerEmbeddingsArtifact
from contracts.errors import DiskFullError, PipelineError
from contracts.io import atomic_write_bytes, is_disk_full
from contracts.jsonl import iter_lines
from orchestrator import layout
from orchestrator.books.journal import Journal
from orchestrator.books.lock import OutputLock
from orchestrator.corpus.captions import TIGHT_NOTE, CaptionRules, tight_note, without_tight_notes
from orchestrator.corpus.labels import channel_turns, corpus_labels, label_transcript, read_corpus
from orchestrator.corpus.outputs import TRANSLATED, Sources, translated_name, write_formats
from orchestrator.corpus.page import index_pieces
from orchestrator.planning.inputs import load_ids

log = logging.getLogger(__name__)


def audio_href(directory: Path, transcript: TranscriptArtifact) -> str | None:
    """What the page plays, relative to the input's folder: the compressed copy beside it, else the
    source (when it is a local file: moving the output folder alone then loses it), else nothing."""
    if (directory / layout.LISTEN).is_file():
        return layout.LISTEN
    source = Path(transcript.source)
    if "://" not in transcript.source and source.is_file():
        return os.path.relpath(source.resolve(), directory.resolve())
    return None


def load_sources(
    directory: Path,
    item_id: str,
    rules: CaptionRules,
    notes: list[str] | None = None,
    transcript: TranscriptArtifact | None = None,
    diarization: DiarizationArtifact | None = None,
    corpus: dict[str, tuple[str, str]] | None = None,
) -> Sources:
    """An input's :class:`Sources` from its folder (artifacts already read may be passed in); ``corpus``: its
    speakers' corpus speakers (:func:`orchestrator.corpus.labels.corpus_labels`)."""
    transcript = transcript or load_artifact(directory / "transcript.json", TranscriptArtifact)
    if diarization is None and (directory / "diarization.json").exists():
        diarization = load_artifact(directory / "diarization.json", DiarizationArtifact)
    names: dict[str, str] = {}
    if (directory / "speaker_embeddings.json").exists():
        try:  # only the names are read: the sidecar's vectors are not needed here
            matched = SpeakerEmbeddingsArtifact.model_validate_json(
                (directory / "speaker_embeddings.json").read_bytes()
            )
            names = {m.speaker: m.name for m in matched.matches if m.name}
        except ValueError as exc:
            log.warning("%s: speaker names not read: %s", item_id, exc)
    corpus = corpus or {}
    # separated channels: each channel's speaker's turns, from its words (who overlaps whom)
    turns = channel_turns(transcript) or (diarization.turns if diarization else None)

    def sources(track: TranscriptArtifact, languages: list[tuple[str, str | None]]) -> Sources:
        labelled = label_transcript(track, turns, names, corpus)
        return Sources(
            item_id=item_id,
            transcript=labelled.transcript,
            rules=rules,
            diarization=diarization,
            names=names,
            corpus=corpus,
            file_speakers=labelled.file_speakers,
            corpus_speakers=labelled.corpus_speakers,
            notes=list(notes or []),
            audio=audio_href(directory, transcript),
            languages=languages,
        )

    if not transcript.translation:
        return with_tight_notes(sources(transcript, []))
    # the English translation (--translate): the same speakers, labels and caption rules; each page links
    # to the other
    page = layout.FORMATS["html"]
    original = f"{transcript.language} (original)"
    english = transcript.model_copy(
        update={
            "segments": transcript.translation,
            "language": TRANSLATED,
            "translation": None,
            "languages": None,  # the English track is of one language
            "languages_note": None,
        }
    )
    src = sources(transcript, [(original, None), ("English", translated_name(page))])
    src.translation = sources(english, [(original, page), ("English", None)])
    return with_tight_notes(src)


def with_tight_notes(src: Sources) -> Sources:
    """``src`` (and its translation) with the notes counting the cues of this rendering that break the time
    rules (:func:`~orchestrator.corpus.captions.tight_note`), in place of any an earlier rendering left:
    each track's on both pages, so the page and the report a person reads count what the files hold."""
    tracks = [(src, None)] + ([(src.translation, "English")] if src.translation is not None else [])
    counted = [
        note
        for track, name in tracks
        if (note := tight_note(track.cues, track.rules.for_language(track.transcript.language), name))
    ]
    for track, _ in tracks:
        track.notes = without_tight_notes(track.notes) + counted
    return src


def tight_notes(src: Sources) -> list[str]:
    """The notes of :func:`with_tight_notes` on ``src``."""
    return [n for n in src.notes if TIGHT_NOTE.match(n)]


def page_notes(summary: dict | None) -> list[str]:
    """The notes an input's page and document show, from its journal summary (what ``process`` wrote them
    with): the plan's (a source given twice), the run's, then the model substitutions."""
    summary = summary if isinstance(summary, dict) else {}
    return [
        str(n)
        for key in ("plan_notes", "notes", "substitutions")
        for n in (summary.get(key) if isinstance(summary.get(key), list) else [])
    ]


def record_written(journal: Journal, item_id: str, event: dict, files: dict[str, str], src: Sources) -> None:
    """An input whose files were written again from ``src`` (``files``: name -> path) into the journal as
    ``process`` records its outputs: its last completed event (``event``) with the new files' sizes and
    times and the notes counting the new captions' tight cues, so the next run still finds it complete,
    keeps these files and reports what they hold. Nothing is recorded without such an event (the next run
    then checks the artifacts the full way)."""
    if not event or not isinstance(event.get("files"), dict):
        return
    stats = dict(event["files"])
    summary = dict(event["summary"]) if isinstance(event.get("summary"), dict) else {}
    notes = summary.get("notes") if isinstance(summary.get("notes"), list) else []
    summary["notes"] = without_tight_notes([str(n) for n in notes]) + tight_notes(src)
    outputs = dict(summary.get("outputs") or {})
    for file_name, path in files.items():
        path = Path(path)
        try:
            st = path.stat()
        except OSError:
            continue
        stats[path.name] = [st.st_size, st.st_mtime_ns]
        outputs[file_name] = str(path)
    summary["outputs"] = outputs
    journal.record(
        item_id, "outputs", "ok", fingerprint=event.get("fingerprint"), files=stats, summary=summary
    )


def journal_for(out: Path, command: str) -> Journal:
    return Journal(
        layout.path(out, layout.JOURNAL), f"{command}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    )


class LastOutputs(NamedTuple):
    """What the index shows of an input's last "outputs" event."""

    status: str | None
    error: str | None
    damage: str | None
    duration_s: float | None


def outputs_events(journal: Path) -> dict[str, LastOutputs]:
    """item id -> what the index shows of its last "outputs" event (status, error, damage, duration): read a
    line at a time and kept as a tuple, so a journal of 100,000 inputs is never held whole nor as dicts."""
    events: dict[str, LastOutputs] = {}
    for line in iter_lines(journal):
        if '"outputs"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if (
            not isinstance(event, dict)
            or event.get("stage") != "outputs"
            or not isinstance(event.get("item"), str)
        ):
            continue
        summary = event.get("summary") if isinstance(event.get("summary"), dict) else {}
        events[event["item"]] = LastOutputs(
            event.get("status"), event.get("error"), summary.get("damage"), summary.get("duration_s")
        )
    return events


def _status(event: LastOutputs | None) -> str:
    if event is None:
        return "not finished"
    if event.status == "ok":
        return "partial" if event.damage else "ok"
    return "failed" if event.status == "failed" else "not finished"


def index_rows(
    out: Path, events: dict[str, LastOutputs] | None = None, sources: dict[str, str] | None = None
) -> Iterator[dict]:
    """One row per input the output folder knows (its index of ids, and the journal): last status, files;
    made one at a time, in the order of the ids (``sources``: id -> source, from the index)."""
    if events is None:
        events = outputs_events(layout.path(out, layout.JOURNAL))
    if sources is None:
        sources = {item_id: source for source, item_id in load_ids(out).items()}
    for item_id in sorted(set(sources) | set(events)):
        event = events.get(item_id)
        directory = os.path.join(out, item_id)  # text: 100,000 rows
        files = sorted(name for name in FORMAT_NAMES if os.path.isfile(os.path.join(directory, name)))
        yield {
            "id": item_id,
            "status": _status(event),
            "source": sources.get(item_id, ""),
            "duration_s": event.duration_s if event else None,
            "error": event.error if event else None,
            "files": files,
        }


def write_index(out: Path, events: dict[str, LastOutputs] | None = None) -> Path:
    """The output folder's ``index.html``, written a row at a time (atomic)."""
    if events is None:
        events = outputs_events(layout.path(out, layout.JOURNAL))
    sources = {item_id: source for source, item_id in load_ids(out).items()}
    counts = Counter(_status(events.get(item_id)) for item_id in set(sources) | set(events))

    def pieces():
        for piece in index_pieces(index_rows(out, events, sources), counts):
            yield piece.encode("utf-8")

    return atomic_write_bytes(layout.path(out, layout.INDEX), pieces)


#: the file names the index links to, when an input's folder has them
FORMAT_NAMES = tuple(layout.FORMATS.values())


@dataclass
class ExportResult:
    written: int = 0
    files: int = 0
    #: id -> why its files could not be written
    failed: dict[str, str] = field(default_factory=dict)
    #: asked for but not in the output folder
    unknown: list[str] = field(default_factory=list)
    seconds: float = 0.0


def export(settings, formats: list[str], only: list[str] | None = None) -> ExportResult:
    """Write ``formats`` for the inputs of ``settings.output_dir`` (``only``: these ids or sources) with the
    current caption settings and each input's notes from the journal; record what was written in the
    journal (the next ``process`` keeps these files); then the index. Holds the output folder's lock (one
    writer at a time). A full disk stops it (:class:`DiskFullError`: the inputs written so far are
    recorded); a damaged ``speakers.json`` is an :class:`ArtifactError` before anything is written."""
    out = Path(settings.output_dir)
    started = time.perf_counter()
    result = ExportResult()
    rules = CaptionRules.from_settings(settings)
    with OutputLock(out, wait=settings.wait_for_output, existing=True):
        labels = corpus_labels(read_corpus(out))
        journal = journal_for(out, "export")
        completed = journal.completed()
        events = outputs_events(journal.path)
        ids = load_ids(out)
        known = sorted(set(ids.values()) | {i for i in events if isinstance(i, str)})
        if only:
            by_source = {str(Path(k)): v for k, v in ids.items()}
            wanted = []
            for name in only:
                item_id = (
                    name if name in known else by_source.get(str(Path(name).absolute()), by_source.get(name))
                )
                if item_id is None:
                    result.unknown.append(name)
                else:
                    wanted.append(item_id)
            known = list(dict.fromkeys(wanted))
        for item_id in known:
            directory = out / item_id
            if not (directory / "transcript.json").exists():
                if only:
                    result.failed[item_id] = "no transcript.json (not processed yet, or it failed)"
                continue
            done = completed.pop(item_id, None)
            # its last completed run, unless a later one failed (that run's state is not this event's)
            last = events.get(item_id)
            last_ok = last is not None and last.status == "ok"
            event = done.event() if done and last_ok else {}
            try:
                src = load_sources(
                    directory, item_id, rules, page_notes(event.get("summary")), corpus=labels.get(item_id)
                )
                files = write_formats(directory, src, formats)
            except (PipelineError, OSError, ValueError) as exc:
                if is_disk_full(exc):
                    raise DiskFullError(str(exc)) from None
                result.failed[item_id] = str(exc)
                log.warning("%s: %s", item_id, exc)
                continue
            result.files += len(files)
            result.written += 1
            record_written(journal, item_id, event, files, src)
        try:
            write_index(out, events)
        except OSError as exc:
            if is_disk_full(exc):
                raise DiskFullError(str(exc)) from None
            raise
    result.seconds = time.perf_counter() - started
    return result
