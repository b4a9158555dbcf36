"""A run's catalogue writer, a child process (``python -m orchestrator.catalogue.writer OUT PARENT_PID``): the
run hands it each chunk's inputs and goes on, and LanceDB, Arrow and the tables' caches live here, not in
the run's parent (at 100,000 inputs they held some 400 MiB there). It dies with the parent.

The protocol, one JSON object a line. The parent's first line: ``{"url": OUTPUT_URL or null}``; then one
line a chunk: ``{"wanted": {input id: fingerprint or null}, "labels": {input id: {file speaker: [corpus
speaker, label]}}}``. The writer answers each chunk with its log records (``{"log": [level, logger,
message]}``) then ``{"done": {"indexed": n, "dropped": n, "failed": n, "seconds": s}}``. The parent closing
the pipe ends it. Its stdout is the protocol's alone: anything printed goes to its stderr.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

#: by name: the child runs this module as __main__
log = logging.getLogger("orchestrator.catalogue.writer")


class ChunkWriter:
    """The writer's work, a chunk at a time: what the catalogue holds is read once (each input's fingerprint)
    and kept up as chunks update it, so a chunk whose inputs are indexed as they are (a resumed run's) costs
    no query at all. The tables' upkeep every :data:`~orchestrator.catalogue.store.OPTIMIZE_EVERY` commits
    runs in a child of its own (its memory goes back when it exits)."""

    def __init__(self, out: Path, url: str | None = None) -> None:
        self.out = Path(out)
        #: where the outputs go (``OUTPUT_URL``): the catalogue is copied beside them as each chunk ends
        self.url = url
        self._catalogue = None
        #: input id -> the fingerprint the catalogue holds it with (read at the first chunk)
        self._known: dict[str, str] | None = None

    def chunk(
        self, wanted: dict[str, str | None], labels: dict[str, dict[str, tuple[str, str]]]
    ) -> dict[str, float]:
        """A chunk's inputs made what ``wanted`` says (input id -> its outputs fingerprint, None when it is
        not complete); ``labels``: their corpus speakers' labels. A failure is logged and counted, never
        raised: the files are the truth, and the next run (or ``pipeline index``) repairs the catalogue."""
        from orchestrator.catalogue.store import Catalogue
        from orchestrator.catalogue.sync import push_catalogue, update

        started = time.perf_counter()
        done = {"indexed": 0, "dropped": 0, "failed": 0}
        try:
            if self._known is None:
                self._catalogue = Catalogue(self.out, upkeep_in_child=True)
                self._known = self._catalogue.indexed()
            todo = {item: fp for item, fp in wanted.items() if self._known.get(item) != fp}
            if todo:
                result = update(self.out, todo, labels=labels, catalogue=self._catalogue, have=self._known)
                for item, fp in todo.items():
                    if fp is None or item in result.failed:
                        self._known.pop(item, None)
                    else:
                        self._known[item] = fp
                done = {"indexed": result.indexed, "dropped": result.dropped, "failed": len(result.failed)}
                if self.url:
                    push_catalogue(self.out, self.url)
                if result.indexed or result.dropped:
                    log.info(
                        "catalogue: %d indexed, %d dropped in %.2f s",
                        result.indexed,
                        result.dropped,
                        result.seconds,
                    )
        except Exception as exc:  # noqa: BLE001 - the files are the truth: the catalogue is repaired later
            done = {"indexed": 0, "dropped": 0, "failed": len(wanted)}
            self._known = None  # read again at the next chunk
            log.warning("catalogue not updated for %d input(s): %s", len(wanted), exc)
        return {**done, "seconds": time.perf_counter() - started}


class _Forward(logging.Handler):
    """Log records to the parent, on the protocol's stream (any thread's, one line at a time)."""

    def __init__(self, stream: IO[str], lock: threading.Lock) -> None:
        super().__init__(logging.INFO)
        self.stream, self.guard = stream, lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps({"log": [record.levelno, record.name, record.getMessage()]})
            with self.guard:  # not the handler's own lock, held already while a record is handled
                self.stream.write(line + "\n")
                self.stream.flush()
        except Exception:  # noqa: BLE001 - a lost record is not the writer's failure
            self.handleError(record)


def serve(out: Path, requests: IO[str], answers: IO[str]) -> None:
    """The writer's loop: a line a chunk from ``requests``, its log records and result to ``answers``."""
    lock = threading.Lock()
    root = logging.getLogger()
    root.addHandler(_Forward(answers, lock))
    # ours from INFO, the libraries' from WARNING (as the run's own log)
    root.setLevel(logging.WARNING)
    logging.getLogger("orchestrator").setLevel(logging.INFO)
    first = requests.readline()
    if not first:
        return
    writer = ChunkWriter(out, json.loads(first).get("url"))
    # LanceDB and Arrow take seconds to import: here while the run's first chunk works
    try:
        import lancedb  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:  # each chunk says it again, as a warning
        log.debug("catalogue: %s", exc)
    for line in requests:
        job = json.loads(line)
        labels = {
            item: {speaker: tuple(label) for speaker, label in speakers.items()}
            for item, speakers in (job.get("labels") or {}).items()
        }
        done = writer.chunk(job["wanted"], labels)
        with lock:
            answers.write(json.dumps({"done": done}) + "\n")
            answers.flush()


def main(argv: list[str]) -> int:
    """``OUT PARENT_PID``: serve the parent until it closes the pipe; die with it."""
    from orchestrator.process.toolkit import die_with_parent

    out, parent = argv
    die_with_parent(int(parent))
    # a Ctrl-C is the run's to handle: it closes the pipe once the chunk being written is
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # a stray print cannot break the protocol
    sys.stdout = sys.stderr
    serve(Path(out), sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
