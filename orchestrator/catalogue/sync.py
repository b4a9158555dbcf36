"""Keep the catalogue what the output folder's files say: the journal names each input's last completed
outputs (and their fingerprint); the catalogue holds the same inputs with the same fingerprints.

:func:`sync` compares the two and (re)indexes what differs, from the artifacts alone, in batches; it drops
the inputs the journal no longer calls complete. A run calls it for each chunk's inputs (the chunk's rows
appended, nothing rewritten) and once over the whole folder before its first chunk (what a kill left
undone is repaired); ``pipeline index`` calls it too, and ``--rebuild`` starts from an empty catalogue
(the corpus speakers' tables kept: they are not derived from the artifacts).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from contracts.report import CatalogueWrites
from orchestrator import layout
from orchestrator.books.journal import Journal
from orchestrator.catalogue.rows import input_rows
from orchestrator.catalogue.store import CATALOGUE_DIR, UPKEEP_TIMEOUT_S, Catalogue
from orchestrator.corpus.export import outputs_events
from orchestrator.corpus.labels import corpus_labels, read_corpus

log = logging.getLogger(__name__)

#: inputs indexed per commit
BATCH = 200
#: chunks handed to a run's catalogue writer that may wait for it before the run waits too: a run's chunks
#: take minutes and the writer seconds, but a resumed run's take milliseconds while the writer imports
#: LanceDB (each waiting chunk holds only its inputs' ids and labels)
BEHIND = 256
#: seconds the writer has to exit once its pipe is closed (every chunk handed to it is answered by then)
STOP_S = 60.0
#: chunks waiting for the writer sent to it at once, at most
MERGE = 64
#: seconds a chunk may take in the writer (its tables' upkeep, in a child bounded at
#: :data:`~orchestrator.catalogue.store.UPKEEP_TIMEOUT_S`, included) before the writer is killed as hung
CHUNK_TIMEOUT_S = UPKEEP_TIMEOUT_S + 600.0


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


class Indexer:
    """A run's hand on its output folder's catalogue, beside the run: each chunk's inputs are handed to the
    catalogue's writer, a child process (:mod:`orchestrator.catalogue.writer`: LanceDB's memory is never the
    parent's), as the chunk ends, and the run goes on to its next chunk while they are written. A thread
    of the parent feeds the child; at most :data:`BEHIND` chunks wait for it, and a run that outpaces it
    waits there (the ``waited_s`` of its report). A failure (the child's too) is logged, never the run's:
    the next chunk starts a new writer, and the next run, or ``pipeline index``, repairs the catalogue from
    the files. :meth:`close` waits for what was handed over (or, after a hard stop, for the chunk being
    written)."""

    def __init__(self, out: Path, url: str | None = None) -> None:
        self.out = Path(out)
        #: where the outputs go (``OUTPUT_URL``): the writer copies the catalogue beside them
        self.url = url
        self.stats = IndexerStats()
        self._child: subprocess.Popen | None = None
        self._errors: IO[str] | None = None  # the child's stderr (read only when it failed)
        self._queue: queue.Queue = queue.Queue(maxsize=BEHIND)
        self._started = threading.Event()
        self._feeder = threading.Thread(target=self._feed, name="catalogue-feeder", daemon=True)
        self._feeder.start()

    @property
    def pid(self) -> int | None:
        """The writer child's process id (None while none runs)."""
        self._started.wait()
        child = self._child
        return child.pid if child is not None else None

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
        self._feeder.join()
        self.stats.waited_s += time.perf_counter() - started
        return CatalogueWrites(**asdict(self.stats))

    def _feed(self) -> None:
        # started at once: LanceDB and Arrow take seconds to import, in the child while the first chunk works
        self._start()
        self._started.set()
        try:
            last = False
            while not last:
                # the chunks waiting go to the writer as one: a resumed run's 2,000 cost a few round trips
                jobs = [self._queue.get()]
                while jobs[-1] is not None and len(jobs) < MERGE:
                    try:
                        jobs.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    chunks = [job for job in jobs if job is not None]
                    last = len(chunks) < len(jobs)
                    if chunks:
                        wanted: dict[str, str | None] = {}
                        labels: dict[str, dict[str, tuple[str, str]]] = {}
                        for chunk_wanted, chunk_labels in chunks:  # a later chunk's word on an input wins
                            wanted.update(chunk_wanted)
                            labels.update(chunk_labels)
                        self.stats.chunks += len(chunks)
                        self._write(wanted, labels)
                finally:
                    for _ in jobs:
                        self._queue.task_done()
        finally:
            self._stop()

    def _write(self, wanted: dict[str, str | None], labels: dict[str, dict[str, tuple[str, str]]]) -> None:
        """Chunks' inputs through the child, waited for (its log records logged here as they come)."""
        try:
            if self._child is None:
                self._start()
            child = self._child
            if child is None:
                raise OSError("the writer could not start")
            child.stdin.write(json.dumps({"wanted": wanted, "labels": labels}) + "\n")
            child.stdin.flush()
            watchdog = threading.Timer(CHUNK_TIMEOUT_S, child.kill)
            watchdog.daemon = True
            watchdog.start()
            try:
                done = self._answer(child)
            finally:
                watchdog.cancel()
            if done is None:
                raise EOFError(f"the writer exited {child.wait()}: {self._stderr_tail()}")
            self.stats.indexed += done["indexed"]
            self.stats.dropped += done["dropped"]
            self.stats.failed += done["failed"]
            self.stats.seconds += done["seconds"]
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            self.stats.failed += len(wanted)
            log.warning("catalogue not updated for %d input(s): %s", len(wanted), " ".join(str(exc).split()))
            self._stop()  # the next chunk starts another

    @staticmethod
    def _answer(child: subprocess.Popen) -> dict | None:
        """The writer's result for what it was sent, its log records logged here as they come (None: it died
        first)."""
        for line in child.stdout:
            answer = json.loads(line)
            if "log" not in answer:
                return answer["done"]
            level, name, message = answer["log"]
            logging.getLogger(name).log(level, "%s", message)
        return None

    def _start(self) -> None:
        self._errors = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        command = [sys.executable, "-m", "orchestrator.catalogue.writer", str(self.out), str(os.getpid())]
        try:
            self._child = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._errors,
                text=True,
                encoding="utf-8",
                start_new_session=True,  # a Ctrl-C is the run's; the child dies with the run all the same
            )
            self._child.stdin.write(json.dumps({"url": self.url}) + "\n")
            self._child.stdin.flush()
        except OSError as exc:  # the chunk that needs it says so
            log.debug("catalogue writer not started: %s", exc)
            self._stop()

    def _stop(self) -> None:
        """The child's pipe closed and the child waited for (killed when it does not end in :data:`STOP_S`)."""
        child, self._child = self._child, None
        if child is not None:
            try:
                child.stdin.close()
            except OSError:
                pass
            try:
                child.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            child.stdout.close()
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def _stderr_tail(self) -> str:
        if self._errors is None:
            return ""
        self._errors.seek(0)
        return " ".join(self._errors.read()[-2000:].split())[-300:]


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
