"""A damaged video is reported partial with how much decoded; a FIFO fails alone; the good one is complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import MEDIA, ROOT
from tests.stages.test_audio import damaged_mp4

pytestmark = pytest.mark.slow


def test_damaged_input_is_partial_and_said_on_the_console(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    damaged_mp4(src / "damaged.mp4", MEDIA)
    os.mkfifo(src / "stream.mp4")
    (src / "good.wav").write_bytes((MEDIA / "speech.wav").read_bytes())
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "process",
            str(src / "damaged.mp4"),
            str(src / "stream.mp4"),
            str(src / "good.wav"),
            "--output",
            str(out),
            "--no-speakers",
            "--embedding-profile",
            "embedded",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the FIFO failed
    report = json.loads((out / "run-report.json").read_text())
    by_id = {i["id"]: i for i in report["inputs"]}
    assert (report["ok"], report["partial"], report["failed"]) == (1, 1, 1)
    assert by_id["damaged"]["status"] == "partial"
    assert (
        by_id["damaged"]["error"].startswith("damaged source: decoded ")
        and " of 10.8 s (" in by_id["damaged"]["error"]
    )
    assert (out / "damaged" / "transcript.srt").is_file(), "what decoded was transcribed"
    assert by_id["stream"]["status"] == "failed" and "not a regular file (FIFO)" in by_id["stream"]["error"]
    assert f"PARTIAL {src / 'damaged.mp4'}: damaged source: decoded" in done.stderr
    assert "1 ok, 1 partial, 1 failed" in done.stderr
