"""Keep the catalogue what the output folder's files say: the journal names each input's last completed
outputs (and their fingerprint); the catalogue holds the same inputs with the same fingerprints.

:func:`sync` compares the two and (re)indexes what differs, from the artifacts alone, in batches; it drops
the inputs the journal no longer calls complete. A run calls it for each chunk's inputs (the chunk's rows
appended, nothing rewritten) and once over the whole folder before its first chunk (what a kill left
undone is repaired); ``pipeline index`` calls it too, and ``--rebuild`` starts from an empty catalogue
(the corpus speakers' tables kept: they are not derived from the artifacts).
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contracts.report import CatalogueWrites
from orchestrator import layout
from orchestrator.books.journal import Journal
from orchestrator.catalogue.rows import input_rows
from orchestrator.catalogue.store import CATALOGUE_DIR, Catalogue
from orchestrator.corpus.export import outputs_events
from orchestrator.corpus.labels import corpus_labels, read_corpus

log = logging.getLogger(__name__)

#: inputs indexed per commit
BATCH = 200
#: chunks handed to a run's catalogue writer that may wait for it before the run waits too: a run's chunks
#: take minutes and the writer seconds, but a resumed run's take milliseconds while the writer imports
#: LanceDB (each waiting chunk holds only its inputs' ids and labels)
BEHIND = 256


@dataclass
class SyncResult:
    indexed: int = 0
    dropped: int = 0
    unchanged: int = 0
    #: input id -> why it could not be indexed (its artifacts are missing or do not validate)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class IndexerStats:
    """What a run's catalogue writer did (the run report's ``catalogue``)."""

    chunks: int = 0
    indexed: int = 0
    dropped: int = 0
    failed: int = 0
    #: the writer's seconds, beside the run
    seconds: float = 0.0
    #: the run's seconds waiting for it (a full hand-over queue, its last chunks at the end)
    waited_s: float = 0.0


def completed_inputs(out: Path) -> dict[str, str]:
    """input id -> the outputs fingerprint of its last completed run, for the inputs whose last outputs event
    is ok (a later failure takes an input out)."""
    path = layout.path(out, layout.JOURNAL)
    if not path.exists():
        return {}
    done = Journal(path, "catalogue").completed()
    last = outputs_events(path)
    return {
        item: completed.fingerprint
        for item, completed in done.items()
        if item in last and last[item].status == "ok"
    }


def sync(out: Path, rebuild: bool = False) -> SyncResult:
    """Bring ``out``'s whole catalogue in line with its journal (``rebuild``: from an empty one): every input
    the journal calls complete whose catalogue row is missing or has another fingerprint is indexed again;
    inputs no longer complete are dropped. What ``pipeline index`` does."""
    out = Path(out)
    if rebuild and (out / CATALOGUE_DIR).exists():
        _drop_derived(out)
    wanted = completed_inputs(out)
    catalogue = Catalogue(out)
    gone = {item: None for item in catalogue.indexed() if item not in wanted}
    result = update(out, {**wanted, **gone}, catalogue=catalogue)
    catalogue.maintain()
    return result


def _drop_derived(out: Path) -> None:
    """Every table made from the artifacts (inputs, segments) removed; the corpus speakers' tables stay (their
    names, merges and splits are a person's work). Without them, the whole folder goes."""
    from orchestrator.books.speakers import TABLES

    catalogue = Catalogue(out)
    kept = [name for name in catalogue._names() if name in TABLES]
    if not kept:
        shutil.rmtree(out / CATALOGUE_DIR)
        return
    for name in catalogue._names():
        if name not in TABLES:
            catalogue.db.drop_table(name)


def update(
    out: Path,
    wanted: dict[str, str | None],
    labels: dict[str, dict[str, tuple[str, str]]] | None = None,
    refresh: Iterable[str] = (),
    catalogue: Catalogue | None = None,
    have: dict[str, str] | None = None,
) -> SyncResult:
    """The catalogue rows of these inputs made what ``wanted`` says (input id -> the outputs fingerprint of
    its completed files; None: not complete, so not in the catalogue): an input missing or indexed with
    another fingerprint is indexed from its artifacts, and ``refresh`` ones whatever their fingerprint
    (their speakers were relabelled). Costs what these inputs cost, whatever the folder holds: a run calls
    it for each chunk. ``labels``: the corpus speakers' labels when the caller has them (else read from
    the corpus speakers' store, for those inputs only). ``have``: what the catalogue holds (input id -> its
    fingerprint), when the caller knows it (else read for these inputs)."""
    started = time.perf_counter()
    out = Path(out)
    result = SyncResult()
    catalogue = catalogue or Catalogue(out)
    if have is None:
        have = catalogue.indexed(ids=set(wanted))
    have = {item: have[item] for item in wanted if item in have}
    refresh = set(refresh)
    stale = sorted(i for i, fp in wanted.items() if fp is not None and (have.get(i) != fp or i in refresh))
    gone = sorted(i for i, fp in wanted.items() if fp is None and i in have)
    result.unchanged = sum(1 for i, fp in wanted.items() if fp is not None and i not in stale)
    uncovered = {item for item in stale if labels is None or item not in labels}
    if uncovered:  # the caller's labels do not cover them: the store's, for these inputs only
        labels = {**_stored_labels(out, uncovered), **(labels or {})}
    for first in range(0, len(stale), BATCH):
        batch = []
        for item_id in stale[first : first + BATCH]:
            try:
                batch.append(
                    input_rows(out, item_id, (labels or {}).get(item_id), fingerprint=wanted[item_id])
                )
            except (OSError, ValueError) as exc:
                result.failed[item_id] = " ".join(str(exc).split())[:300]
                log.warning("catalogue: %s not indexed: %s", item_id, result.failed[item_id])
        catalogue.put(batch)
        result.indexed += len(batch)
    # an input that cannot be indexed now is not left as it was indexed before
    catalogue.drop(sorted({*gone, *result.failed}))
    result.dropped = len(gone)
    result.seconds = time.perf_counter() - started
    return result


def _stored_labels(out: Path, items: set[str]) -> dict[str, dict[str, tuple[str, str]]]:
    """The corpus speakers' labels of ``items``: from the store, reading only their rows (an output folder of
    an earlier version: from its ``speakers.json``)."""
    from orchestrator.books.speakers import SpeakerStore

    store = SpeakerStore(out)
    if store.exists():
        return store.labels(items)
    labels = corpus_labels(read_corpus(out))
    return {item: labels[item] for item in items if item in labels}


def _import_store() -> None:
    try:
        import lancedb  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:  # the chunk's update says it again, as a warning
        log.debug("catalogue: %s", exc)


class Indexer:
    """A run's hand on its output folder's catalogue, beside the run: each chunk's inputs are handed to a
    writer thread as the chunk ends, and the run goes on to its next chunk while they are written (the
    upkeep every :data:`~orchestrator.catalogue.store.OPTIMIZE_EVERY` commits included). At most
    :data:`BEHIND` chunks wait for the writer; a run that outpaces it waits there (the ``waited_s`` of its
    report). What the catalogue holds is read once per run (each input's fingerprint) and kept up as chunks
    update it, so a chunk whose inputs are indexed as they are (a resumed run's) costs no query at all.
    A failure is logged, never the run's: the next run, or ``pipeline index``, repairs the catalogue from the
    files. :meth:`close` waits for what was handed over (or, after a hard stop, for the chunk being written)."""

    def __init__(self, out: Path, url: str | None = None) -> None:
        self.out = Path(out)
        #: where the outputs go (``OUTPUT_URL``): the catalogue is copied beside them as each chunk ends
        self.url = url
        self.stats = IndexerStats()
        self._catalogue: Catalogue | None = None
        #: input id -> the fingerprint the catalogue holds it with (read at the first chunk's end)
        self._known: dict[str, str] | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=BEHIND)
        # LanceDB and Arrow take seconds to import: the writer imports them while the first chunk's children
        # work (the parent mostly waits on them), not on the run's critical path
        self._writer = threading.Thread(target=self._write, name="catalogue-writer", daemon=True)
        self._writer.start()

    def chunk_done(
        self, wanted: dict[str, str | None], labels: dict[str, dict[str, tuple[str, str]]]
    ) -> None:
        """Hand a chunk's inputs to the writer (``wanted``: input id -> its outputs fingerprint, None when it
        is not complete; ``labels``: their corpus speakers' labels)."""
        started = time.perf_counter()
        self._queue.put((dict(wanted), labels))
        self.stats.waited_s += time.perf_counter() - started

    def flush(self) -> None:
        """Wait until every chunk handed over is written."""
        self._queue.join()

    def close(self, drain: bool = True) -> CatalogueWrites:
        """Stop the writer once what was handed over is written (``drain``), or once the chunk being written is
        (the chunks still waiting are left to the next run's repair). What it did, as the run report says it."""
        if not drain:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
                self._queue.task_done()
        started = time.perf_counter()
        self._queue.put(None)
        self._writer.join()
        self.stats.waited_s += time.perf_counter() - started
        return CatalogueWrites(**asdict(self.stats))

    def _write(self) -> None:
        _import_store()
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                started = time.perf_counter()
                self._update(*job)
                self.stats.chunks += 1
                self.stats.seconds += time.perf_counter() - started
            finally:
                self._queue.task_done()

    def _update(self, wanted: dict[str, str | None], labels: dict[str, dict[str, tuple[str, str]]]) -> None:
        try:
            if self._known is None:
                self._catalogue = Catalogue(self.out, upkeep_in_child=True)
                self._known = self._catalogue.indexed()
            todo = {item: fp for item, fp in wanted.items() if self._known.get(item) != fp}
            if not todo:
                return
            result = update(self.out, todo, labels=labels, catalogue=self._catalogue, have=self._known)
        except Exception as exc:  # noqa: BLE001 - the files are the truth: the catalogue is repaired later
            self.stats.failed += len(wanted)
            self._known = None  # read again at the next chunk
            log.warning("catalogue not updated for %d input(s): %s", len(wanted), exc)
            return
        for item, fp in todo.items():
            if fp is None or item in result.failed:
                self._known.pop(item, None)
            else:
                self._known[item] = fp
        self.stats.failed += len(result.failed)
        self.stats.indexed += result.indexed
        self.stats.dropped += result.dropped
        if self.url:
            push_catalogue(self.out, self.url)
        if result.indexed or result.dropped:
            log.info(
                "catalogue: %d indexed, %d dropped in %.2f s", result.indexed, result.dropped, result.seconds
            )


def push_catalogue(out: Path, url: str) -> None:
    """The catalogue copied beside the outputs at ``url`` (:func:`~orchestrator.catalogue.mirror.push`); a
    failure is a warning: the next chunk, or the run's end, copies what is missing."""
    from orchestrator.catalogue.mirror import push
    from orchestrator.remote import redact

    try:
        push(out, url)
    except Exception as exc:  # noqa: BLE001 - any protocol's failure; the local catalogue is whole
        log.warning("catalogue not copied to %s: %s", redact(url), " ".join(str(exc).split())[:300])


def relabel(out: Path) -> SyncResult:
    """After ``pipeline speakers`` changed who is who (name, merge, split, cluster): the inputs whose
    catalogue rows show other speakers than the corpus speakers now give them are indexed again."""
    out = Path(out)
    catalogue = Catalogue(out)
    if not catalogue.exists:
        return SyncResult()
    labels = corpus_labels(read_corpus(out))
    stale: set[str] = set()
    for name in catalogue.segment_tables():
        table = catalogue.db.open_table(name)
        columns = ["input", "file_speaker", "speaker", "corpus_speaker"]
        for row in table.search().select(columns).limit(None).to_list():
            now = labels.get(row["input"], {}).get(row["file_speaker"])
            if now is not None and (row["corpus_speaker"], row["speaker"]) != now:
                stale.add(row["input"])
            elif now is None and row["corpus_speaker"]:
                stale.add(row["input"])
    if not stale:
        return SyncResult()
    wanted = completed_inputs(out)
    return update(
        out, {item: wanted.get(item) for item in stale}, labels=labels, refresh=stale, catalogue=catalogue
    )
