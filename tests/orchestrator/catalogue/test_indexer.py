"""A run's Indexer: chunks are handed to a writer child process and the run goes on, waiting only when the writer is
:data:`~orchestrator.catalogue.sync.BEHIND` chunks behind; what the catalogue holds is read once, so chunks
whose inputs are indexed as they are (a resumed run's) commit nothing; an input no longer complete is
dropped, once."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from orchestrator.catalogue.store import INPUTS, Catalogue
from orchestrator.catalogue.sync import BEHIND, Indexer
from tests.orchestrator.catalogue.test_store import rows


def versions(out) -> int:
    return Catalogue(out).db.open_table(INPUTS).version


def test_chunks_indexed_as_they_are_cost_no_commit_and_a_changed_input_is_redone(tmp_path):
    Catalogue(tmp_path).put([rows(f"in{n}", [f"text {n}"], fingerprint=f"fp{n}") for n in range(6)])
    before = versions(tmp_path)
    indexer = Indexer(tmp_path)
    for first in (0, 3):  # two chunks of a resumed run: every input as the catalogue holds it
        indexer.chunk_done({f"in{n}": f"fp{n}" for n in range(first, first + 3)}, {})
    indexer.flush()
    assert versions(tmp_path) == before and indexer.stats.failed == 0
    # an input no longer complete (a later run failed it): dropped, the others left as they are
    indexer.chunk_done({"in1": None, "in2": "fp2"}, {})
    indexer.flush()
    assert indexer.stats.failed == 0 and versions(tmp_path) > before
    assert set(Catalogue(tmp_path).indexed()) == {"in0", "in2", "in3", "in4", "in5"}
    # the indexer knows it is gone: the same chunk again commits nothing
    after = versions(tmp_path)
    indexer.chunk_done({"in1": None, "in2": "fp2"}, {})
    assert versions(tmp_path) == after
    indexer.flush()
    assert versions(tmp_path) == after
    stats = indexer.close()
    assert (stats.chunks, stats.dropped, stats.indexed, stats.failed) == (4, 1, 0, 0)


@contextmanager
def held(indexer: Indexer):
    """The writer child stopped (SIGSTOP) until the block ends, writing chunk ``in0`` (taken alone: the
    chunks waiting are sent together): what it is handed next waits."""
    pid = indexer.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        indexer.chunk_done({"in0": "fp"}, {})
        deadline = time.monotonic() + 30
        while indexer._queue.qsize() and time.monotonic() < deadline:  # the feeder took it
            time.sleep(0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_the_run_goes_on_while_chunks_are_written_and_waits_only_when_the_writer_is_behind(tmp_path):
    indexer = Indexer(tmp_path)
    with held(indexer):
        # the feeder holds the first chunk for the stopped writer; BEHIND more wait: each returns at once
        for n in range(1, 1 + BEHIND):
            indexer.chunk_done({f"in{n}": "fp"}, {})
        late = threading.Thread(target=indexer.chunk_done, args=({"late": "fp"}, {}))
        late.start()
        late.join(0.5)
        assert late.is_alive()  # one more: the run waits for the writer
    late.join(60)
    stats = indexer.close()
    # no artifacts behind these inputs: each is a failure the writer counted, the run none of its own
    assert (stats.chunks, stats.indexed, stats.failed) == (2 + BEHIND, 0, 2 + BEHIND)
    assert stats.waited_s >= 0.4


def test_a_hard_stop_waits_for_the_chunk_being_written_and_leaves_the_rest_to_the_next_run(tmp_path):
    indexer = Indexer(tmp_path)
    with held(indexer):
        for n in range(1, 1 + BEHIND):
            indexer.chunk_done({f"in{n}": "fp"}, {})
        closing = threading.Thread(target=indexer.close, kwargs={"drain": False})
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # the chunk being written is finished, not cut
    closing.join(60)
    assert not closing.is_alive() and indexer.stats.chunks == 1


def test_the_writer_is_a_child_and_a_killed_one_costs_its_chunk_only(tmp_path, caplog):
    Catalogue(tmp_path).put([rows("in0", ["text"], fingerprint="fp0")])
    indexer = Indexer(tmp_path)
    first = indexer.pid
    assert b"orchestrator.catalogue.writer" in Path(f"/proc/{first}/cmdline").read_bytes()
    os.kill(first, signal.SIGKILL)
    indexer.chunk_done({"in0": None}, {})
    indexer.flush()
    assert indexer.stats.failed == 1 and "catalogue not updated for 1 input(s)" in caplog.text
    indexer.chunk_done({"in0": None}, {})  # a new writer for the next chunk: the input dropped
    indexer.flush()
    assert indexer.pid not in (None, first)
    stats = indexer.close()
    assert (stats.chunks, stats.dropped, stats.failed) == (2, 1, 1)
    assert Catalogue(tmp_path).indexed() == {}
