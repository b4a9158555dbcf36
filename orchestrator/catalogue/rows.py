"""What the catalogue holds of one input, read from its artifacts alone.

The per-input files stay what users hand on; the catalogue is derived from them. :func:`input_rows` reads
an input's labelled transcript (as ``pipeline export`` does: the corpus speakers' labels of
``speakers.json``), its embeddings artifact (its sidecar checked by sha256) and makes one row per segment
with the vector and the model it came from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from contracts import EmbeddingsArtifact, load_artifact
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources

log = logging.getLogger(__name__)


@dataclass
class InputRows:
    """One input's rows: its record, its segments (without vectors) and their vectors in segment order."""

    input: dict
    segments: list[dict] = field(default_factory=list)
    #: float32, one unit-norm row per segment (None: the input has no embeddings)
    vectors: np.ndarray | None = None


def folder_of(item_id: str) -> str:
    """The folder an input id lies in ("" for a loose file): what ``--under`` matches."""
    parent = str(PurePosixPath(item_id).parent)
    return "" if parent == "." else parent


def input_rows(
    out: Path,
    item_id: str,
    corpus: dict[str, tuple[str, str]] | None = None,
    status: str = "ok",
    fingerprint: str = "",
    duration_s: float | None = None,
) -> InputRows:
    """``item_id``'s rows from ``out/<item_id>/``: ``corpus`` is its speakers' corpus labels
    (:func:`orchestrator.corpus.labels.corpus_labels`). Raises ArtifactError (or OSError) for an artifact
    that is missing or does not validate: the input is then left out, never half-indexed."""
    directory = out / item_id
    src = load_sources(directory, item_id, CaptionRules(), corpus=corpus)
    transcript = src.transcript
    vectors, model = None, ""
    if (directory / "embeddings.json").exists():  # none: a language-identification run (words only)
        embeddings = load_artifact(directory / "embeddings.json", EmbeddingsArtifact)
        vectors = np.load(directory / embeddings.sidecar, allow_pickle=False).astype(np.float32, copy=False)
        if vectors.shape[0] != len(transcript.segments):
            raise ValueError(f"{vectors.shape[0]} embeddings for {len(transcript.segments)} segments")
        model = embeddings.model or embeddings.profile
    language = transcript.language or "unknown"
    segments = []
    for n, segment in enumerate(transcript.segments):
        segments.append(
            {
                "input": item_id,
                "folder": folder_of(item_id),
                "segment": segment.id,
                "start": float(segment.start),
                "end": float(segment.end),
                "speaker": segment.speaker or "",
                "file_speaker": (src.file_speakers[n] if src.file_speakers else segment.speaker) or "",
                "corpus_speaker": (src.corpus_speakers[n] if src.corpus_speakers else None) or "",
                "language": getattr(segment, "language", None) or language,
                "text": segment.text.strip(),
                "model": model,
            }
        )
    languages = sorted({s["language"] for s in segments}) or [language]
    record = {
        "input": item_id,
        "folder": folder_of(item_id),
        "status": status,
        "duration_s": duration_s if duration_s is not None else transcript.duration_s,
        "language": language,
        "languages": ",".join(languages),
        "asr_model": transcript.model or "",
        "embedding_model": model,
        "segments": len(segments),
        "fingerprint": fingerprint,
    }
    return InputRows(record, segments, vectors)
