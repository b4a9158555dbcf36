"""The run directory's journal: a writer killed mid-line never costs the next run an entry."""

from __future__ import annotations

import signal
import subprocess
import sys

from orchestrator.books.journal import Journal

# a writer that appends one whole event, then half of the next one, and waits to be killed
_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b'{"run": "first", "item": "a", "stage": "outputs", "status": "ok"}\\n')
os.write(fd, b'{"run": "first", "item": "b", "stage": "out')
os.fsync(fd)
print("torn", flush=True)
time.sleep(60)
"""


def test_a_torn_last_line_is_ended_before_the_next_run_appends(tmp_path):
    path = tmp_path / "journal.jsonl"
    # Given a writer killed with SIGKILL in the middle of a line
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "torn"
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=10) == -signal.SIGKILL
    assert not path.read_bytes().endswith(b"\n")
    # When the next run records its first events
    journal = Journal(path, "second")
    journal.record("b", "outputs", "ok", fingerprint="f")
    journal.record("c", "outputs", "ok", fingerprint="g")
    # Then each is a line of its own and reads back; the torn line alone is lost
    events = journal.events()
    assert [(e["run"], e["item"]) for e in events] == [("first", "a"), ("second", "b"), ("second", "c")]
    assert set(journal.completed()) == {"a", "b", "c"}
    assert path.read_bytes().count(b"\n") == 4


def test_reading_a_torn_journal_writes_nothing(tmp_path):
    """``--dry-run`` reads the journal: it must leave the file as it found it."""
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"run": "first", "item": "a", "stage": "outputs", "status": "ok"}\n{"run": "fi')
    before = path.read_bytes()
    assert set(Journal(path, "plan").completed()) == {"a"}
    assert path.read_bytes() == before


def test_completed_runs_keep_their_place_in_the_file_not_their_lines(tmp_path):
    """A corpus's journal holds 100,000 completed inputs of ~1.7 kB each: planning keeps where they are."""
    import tracemalloc

    path = tmp_path / "journal.jsonl"
    journal = Journal(path, "first")
    summary = {"notes": ["n" * 1500], "text_language": "pt", "outputs": {"txt": "/x/transcript.txt"}}
    for number in range(2000):
        journal.record(f"talks/{number:04d}", "outputs", "ok", fingerprint=f"f{number}", summary=summary)
    # Given the journal read as a run reads it
    tracemalloc.start()
    try:
        completed = Journal(path, "plan").completed()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Then what is held is a small part of the 3.5 MB of lines, and each input's language is at hand
    assert path.stat().st_size > 2000 * 1500
    assert held < 2000 * 600, held
    assert completed["talks/0007"].text_language == "pt"
    # and a later run's appends leave each place where it was: the event read back is the one recorded
    Journal(path, "second").record("talks/0007", "outputs", "ok", fingerprint="new", summary={})
    event = completed["talks/0007"].event()
    assert (event["item"], event["fingerprint"], event["summary"]) == ("talks/0007", "f7", summary)
    assert Journal(path, "plan").completed()["talks/0007"].fingerprint == "new"
