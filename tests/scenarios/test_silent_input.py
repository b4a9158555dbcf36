"""End to end: `pipeline process` on five seconds of silence, offline. Nothing is said, so nothing is aligned,
and the run gives no advice to fetch an aligner."""

from __future__ import annotations

import subprocess
import sys
import wave

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_a_silent_input_gets_no_alignment_note(tmp_path):
    silent = tmp_path / "silence.wav"
    with wave.open(str(silent), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\0\0" * 16000 * 5)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", str(silent), "--output", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    assert "1 ok, 0 failed" in console
    assert "NOTE alignment" not in console and "no word timing" not in console, console[-3000:]
    report = (tmp_path / "out" / "run-report.json").read_text()
    assert "no word timing" not in report
