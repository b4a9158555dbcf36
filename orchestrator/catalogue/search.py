"""``pipeline search`` and ``POST /v1/search``: a corpus searched by words, meaning or both (hybrid: the two
rankings fused by rank, :func:`~orchestrator.catalogue.fusion.fuse`), with filters.

Words are the catalogue's full-text index (BM25); meaning is the segments' vectors against the query's,
embedded by the settings' embeddings model in a worker child (:mod:`orchestrator.catalogue.query`), and
only vectors of that very model are compared: the inputs indexed with another model are counted, not
searched. Names and rare words are what vectors miss, so the default is hybrid. In the hybrid, the full-text
ranking keeps only the hits that hold at least half of the query's words (:func:`~orchestrator.catalogue.
fusion.cover`): a hit sharing one word of a paraphrase would otherwise beat the vectors' best.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from contracts.api import SegmentHit
from orchestrator.catalogue.fusion import MIN_COVER, cover, fuse, mark
from orchestrator.catalogue.query import QueryVector
from orchestrator.catalogue.store import CATALOGUE_DIR, Catalogue, quote

log = logging.getLogger(__name__)

Mode = Literal["words", "meaning", "hybrid"]
MODES: tuple[str, ...] = ("hybrid", "words", "meaning")
#: each ranking's depth before fusion (hybrid)
FUSE_DEPTH = 50


class SearchError(Exception):
    """The search cannot be made (no catalogue, a bad filter)."""


@dataclass(frozen=True)
class Filters:
    speaker: str | None = None
    language: str | None = None
    under: str | None = None
    input: str | None = None

    def where(self) -> str | None:
        """The filters as one Lance SQL condition (None: no filter)."""
        parts = []
        if self.speaker:
            parts.append(f"(corpus_speaker = {quote(self.speaker)} OR speaker = {quote(self.speaker)})")
        if self.language:
            parts.append(f"language = {quote(self.language)}")
        if self.under:
            folder = self.under.strip("/")
            like = folder.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            parts.append(f"(folder = {quote(folder)} OR folder LIKE {quote(like + '/%')})")
        if self.input:
            parts.append(f"input = {quote(self.input)}")
        return " AND ".join(parts) or None


class Hit(SegmentHit):
    #: the transcript page at this moment, relative to the output folder
    link: str


@dataclass
class SearchResult:
    query: str
    mode: str
    hits: list[Hit] = field(default_factory=list)
    #: the model the query was embedded by (None: words only)
    model: str | None = None
    #: inputs whose vectors are of another model: not searched by meaning
    unsearched: int = 0
    indexed: int = 0
    seconds: float = 0.0


def _hit(row: dict, query: str, score: float) -> Hit:
    return Hit(
        input=row["input"],
        segment=int(row["segment"]),
        start=float(row["start"]),
        end=float(row["end"]),
        speaker=row["speaker"],
        corpus_speaker=row["corpus_speaker"],
        language=row["language"],
        text=row["text"],
        marked=mark(row["text"], query),
        score=round(float(score), 6),
        link=f"{row['input']}/transcript.html#t={float(row['start']):.2f}",
    )


#: catalogues kept open for searches, by folder, with what names the catalogue directory they opened
_READERS: dict[Path, tuple[tuple[int, int], Catalogue]] = {}


def reader(out: Path) -> Catalogue | None:
    """``out``'s catalogue kept open for searches (None: it has none). It is opened again when its directory
    is another one (``pipeline index --rebuild``) or holds another set of tables (a new model's)."""
    path = Path(out).resolve()
    try:
        info = (path / CATALOGUE_DIR).stat()
    except OSError:
        _READERS.pop(path, None)
        return None
    identity = (info.st_ino, info.st_ctime_ns)
    kept = _READERS.get(path)
    if kept is None or kept[0] != identity:
        kept = (identity, Catalogue(path, reader=True))
        _READERS[path] = kept
    return kept[1]


def search(
    out: Path,
    query: str,
    embed: Callable[[str], QueryVector] | None,
    mode: Mode = "hybrid",
    k: int = 10,
    filters: Filters = Filters(),
) -> SearchResult:
    """The ``k`` best segments of ``out``'s catalogue for ``query``. ``embed`` turns the query into its
    vector (not called for ``words``)."""
    started = time.perf_counter()
    query = " ".join(query.split())
    if not query:
        raise SearchError("the query is empty")
    if mode not in MODES:
        raise SearchError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
    catalogue = reader(out)
    if catalogue is None:
        raise SearchError(f"{out} has no catalogue: run `pipeline index {out}` (a run makes it as it goes)")
    models = catalogue.models()
    result = SearchResult(query=query, mode=mode, indexed=sum(models.values()))
    where = filters.where()
    words: list[dict] = []
    near: list[dict] = []
    depth = k if mode != "hybrid" else max(k, FUSE_DEPTH)
    if mode in ("words", "hybrid"):
        words = catalogue.words(query, where, depth)
    if mode in ("meaning", "hybrid"):
        if embed is None:
            raise SearchError("a search by meaning needs the query embedded")
        vector = embed(query)
        result.model = vector.model
        result.unsearched = sum(n for model, n in models.items() if model != vector.model)
        near = catalogue.meaning(vector.vector, vector.model, where, depth)
    if mode == "words":
        result.hits = [_hit(row, query, row["_score"]) for row in words[:k]]
    elif mode == "meaning":
        result.hits = [_hit(row, query, 1.0 - row["_distance"]) for row in near[:k]]
    else:
        rows = {(r["input"], int(r["segment"])): r for r in [*near, *words]}
        fused = fuse(
            [
                [(r["input"], int(r["segment"])) for r in words if cover(r["text"], query) >= MIN_COVER],
                [(r["input"], int(r["segment"])) for r in near],
            ]
        )
        result.hits = [_hit(rows[key], query, score) for key, score in fused[:k]]
    result.seconds = time.perf_counter() - started
    return result
