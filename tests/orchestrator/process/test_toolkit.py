"""The process toolkit's spawn: a child that is still starting does not die of the terminal's Ctrl-C (the
terminal sends SIGINT to the whole foreground group, children included; the parent alone handles it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PARENT = """
import os, signal, sys, time
from orchestrator.process.toolkit import spawn

proc = spawn("tests.orchestrator.process.test_toolkit:mark", [sys.argv[1]], name="starting")
deadline = time.monotonic() + 0.5
while time.monotonic() < deadline and proc.is_alive():  # Ctrl-C again and again while the child starts
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.005)
proc.join(60)
print(proc.exitcode)
"""


def mark(path: str) -> None:
    """The child's work: a file that says it ran."""
    Path(path).write_text("ran")


def test_a_child_interrupted_while_it_starts_runs_and_prints_no_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PARENT, str(tmp_path / "ran")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "0", done.stderr
    assert (tmp_path / "ran").read_text() == "ran"
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
