"""The end of a chunk, after its stages: the survivors' voices placed among the output folder's corpus
speakers, then each input finished (its artifacts read, its outputs written, uploaded where they go).

The one module of the run that imports the products of an output folder (captions, exports, labels,
outputs, corpus speakers; ``write_index`` is handed from here to the report), besides the Orchestrator's
``pipeline speakers`` commands: the chunk loop itself only schedules stages."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from contracts import DiarizationArtifact, EmbeddingsArtifact, TranscriptArtifact, load_artifact
from contracts.artifacts import LISTEN_COPY as LISTEN_SCRATCH
from contracts.errors import DiskFullError, PipelineError
from contracts.io import is_disk_full
from orchestrator import layout
from orchestrator.corpus.captions import CaptionRules, without_tight_notes
from orchestrator.corpus.export import load_sources, tight_notes, write_index
from orchestrator.corpus.labels import channel_turns, overlap_seconds
from orchestrator.corpus.outputs import write_outputs
from orchestrator.planning.state import InputState
from orchestrator.remote import redact, upload
from orchestrator.run.report import model_substitutions
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "Corpus",
    "deliver_books",
    "export_speakers",
    "finish",
    "place_speakers",
    "remove_scratch",
    "write_index",
]


@dataclass
class Corpus:
    """The output folder's corpus speakers during one run: chunks run in parallel place their speakers in
    the catalogue's store one at a time; ``saved`` is the corpus as the last chunk saved it (the run holds
    the output lock: nothing else writes it meanwhile)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    saved: object | None = None
    #: a chunk of this run changed it (OUT/speakers.json is written again at the run's end)
    changed: bool = False


def place_speakers(
    settings: Settings, corpus: Corpus, inputs: list[InputState]
) -> dict[str, dict[str, tuple[str, str]]]:
    """Corpus speakers: the voices of ``inputs`` placed among the folder's corpus speakers (numpy and scipy on
    the stored vectors, no model; what changed is written to the catalogue's store); the files of other
    inputs whose labels this changed are written again. Returns the labels the files of ``inputs`` show. A
    failure here costs the labels, never an input."""
    if not (settings.corpus_speakers and settings.speakers and inputs) or settings.langid_only:
        return {}
    from orchestrator.corpus.speakers import labels_of, place, rewrite

    out = Path(settings.output_dir)
    with corpus.lock:
        try:
            placed = place(settings, out, [inp.id for inp in inputs], corpus.saved)
            corpus.saved = placed.corpus
            corpus.changed |= bool(placed.placed or placed.touched)
            others = placed.changed - {inp.id for inp in inputs}
            if others:
                rewrite(settings, out, others, placed.corpus)
        except (PipelineError, OSError, ValueError) as exc:
            if is_disk_full(exc):
                raise DiskFullError(str(exc)) from None
            log.error("corpus speakers not updated: %s", exc)
            return {}
    if placed.new_speakers:
        log.info(
            "corpus speakers: %d new (%s), %d in all",
            len(placed.new_speakers),
            ", ".join(placed.new_speakers[:10]),
            len(placed.corpus.speakers),
        )
    return labels_of(placed.corpus, [inp.id for inp in inputs])


def export_speakers(settings: Settings, corpus: Corpus) -> bool:
    """At the run's end, OUT/speakers.json written once from the corpus its chunks placed, when they changed it
    or the file is older than the corpus's last save (a run killed before its end) or missing. An export: the
    store is read back, so a failure here costs the file, never the run."""
    out = Path(settings.output_dir)
    if corpus.saved is None:
        return False
    path = layout.path(out, layout.SPEAKERS)
    try:
        behind = path.stat().st_mtime < corpus.saved.updated_at.timestamp()
    except OSError:
        behind = True
    if not (corpus.changed or behind):
        return False
    from orchestrator.corpus.speakers import export_corpus

    with corpus.lock:
        try:
            export_corpus(out, corpus.saved)
        except (PipelineError, OSError) as exc:
            log.error("%s not written (the catalogue keeps the corpus speakers): %s", layout.SPEAKERS, exc)
            return False
    return True


def deliver_books(settings: Settings, out: Path, speakers_written: bool) -> None:
    """A run whose outputs go to a URL: its catalogue (the search tables, the corpus speakers') copied beside
    them, and ``speakers.json`` when this run wrote it; a failure is a warning (the next run copies what is
    missing of the catalogue)."""
    from orchestrator.catalogue.sync import push_catalogue

    push_catalogue(out, settings.output_url)
    speakers = layout.path(out, layout.SPEAKERS)
    if speakers_written and speakers.exists():
        try:
            upload([speakers], settings.output_url)
        except Exception as exc:  # noqa: BLE001 - any protocol's failure; the file stays local
            log.warning("%s not uploaded: %s", layout.SPEAKERS, " ".join(str(exc).split())[:300])


def finish(settings: Settings, inp: InputState, corpus: dict[str, tuple[str, str]] | None = None) -> None:
    """``inp``'s stages are done: read its artifacts, write its outputs (with the corpus speakers' labels),
    move the listening copy, upload; ``inp`` is then complete, or failed at "outputs". A full disk stops
    the run (:class:`DiskFullError`)."""
    import numpy as np  # numpy only: no model library in the parent

    if settings.langid_only:
        try:
            asr = load_artifact(inp.artifact("asr"), TranscriptArtifact)
        except (PipelineError, OSError, ValueError) as exc:
            inp.error, inp.failed_stage = f"reading the language failed: {exc}", "outputs"
            return
        inp.duration_s, inp.language, inp.damage = asr.duration_s, asr.language_id, asr.source_damage
        if inp.language and inp.language.status == "undetermined":  # not_detectable: in `language` only
            inp.notes.append(f"language {inp.language.status}: {inp.language.reason}")
        inp.complete = True
        remove_scratch(settings, inp)
        return
    try:
        transcript = load_artifact(inp.artifact("transcript"), TranscriptArtifact)
        embeddings = load_artifact(inp.artifact("embeddings"), EmbeddingsArtifact)
        vectors = np.load(inp.directory / embeddings.sidecar, allow_pickle=False)
        if transcript.speakers_note and not inp.skipped:  # a fast-path skip already has its note
            inp.notes.append(transcript.speakers_note)
        if transcript.speech_note:  # e.g. silence: no segments, and why
            inp.notes.append(transcript.speech_note)
        if transcript.languages_note:  # several languages, each segment decoded in its own
            inp.notes.append(transcript.languages_note)
        diarization = None
        if inp.artifact("diarization").exists():
            diarization = load_artifact(inp.artifact("diarization"), DiarizationArtifact)
        inp.substitutions = model_substitutions(transcript, embeddings, diarization)
        inp.damage = transcript.source_damage
        inp.language = transcript.language_id
        if embeddings.language_note:
            inp.notes.append(embeddings.language_note)
        if inp.language and inp.language.status == "undetermined":  # not_detectable: in `language` only
            inp.notes.append(f"language {inp.language.status}: {inp.language.reason}")
        if transcript.source_track:
            inp.notes.append(transcript.source_track)
        listen = inp.directory / ".work" / LISTEN_SCRATCH
        if listen.exists():  # the audio stage's compressed copy, kept for the transcript page
            os.replace(listen, inp.directory / layout.LISTEN)
        turns = channel_turns(transcript) or (diarization.turns if diarization is not None else None)
        inp.overlap_s = overlap_seconds(turns) if turns is not None else None
        src = load_sources(
            inp.directory,
            inp.id,
            CaptionRules.from_settings(settings),
            [*inp.notes, *inp.substitutions],
            transcript,
            diarization,
            corpus,
        )
        # cues the words come too fast for: counted once per track, on the pages and in the report
        inp.notes = without_tight_notes(inp.notes) + tight_notes(src)
        inp.outputs = write_outputs(inp.directory, src, embeddings, vectors, settings.export_formats)
        if settings.output_url:
            _upload(settings, inp)
        inp.duration_s = transcript.duration_s
    except (PipelineError, OSError, ValueError) as exc:
        if is_disk_full(exc):
            raise DiskFullError(str(exc)) from None  # the run stops; this input resumes next run
        inp.error, inp.failed_stage = f"writing outputs failed: {exc}", "outputs"
        return
    inp.complete = True
    remove_scratch(settings, inp)


def remove_scratch(settings: Settings, inp: InputState) -> None:
    """``inp``'s scratch folder (decoded audio, a URL's download) removed, unless ``keep_audio``."""
    if not settings.keep_audio:
        shutil.rmtree(inp.directory / ".work", ignore_errors=True)


def _upload(settings: Settings, inp: InputState) -> None:
    """The input's outputs and artifacts to OUTPUT_URL/<id>/ (a failure fails it; a rerun uploads again)."""
    url = f"{settings.output_url.rstrip('/')}/{inp.id}"
    files = sorted(p for p in inp.directory.iterdir() if p.is_file())
    try:
        upload(files, url)
    except Exception as exc:  # noqa: BLE001 - any protocol's failure fails this input; a rerun uploads again
        raise OSError(f"upload to {redact(url)} failed: {type(exc).__name__}: {exc}") from None
    inp.outputs = {name: redact(f"{url}/{Path(path).name}") for name, path in inp.outputs.items()}
