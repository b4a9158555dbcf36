"""The run directory's journal: a writer killed mid-line never costs the next run an entry."""

from __future__ import annotations

import signal
import subprocess
import sys

from orchestrator.run.journal import Journal

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
