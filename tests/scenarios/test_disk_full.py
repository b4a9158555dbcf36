"""A full disk, on a real small tmpfs, through the CLI with real stage children: the run
stops cleanly with one line saying where, exits DISK_FULL (5), and the next run resumes with nothing lost;
full before the run: exit 2 with the reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from contracts import ExitCode
from tests.conftest import ROOT, process_args, wait_for
from tests.fixtures.disk import fill, tmpfs
from tests.fixtures.generate import clips

pytestmark = pytest.mark.slow

ENV = {**os.environ, "ASR_MODEL": "embedded", "PIPELINE_ALLOW_HUB": "false", "EMBEDDING_PROFILE": "embedded"}


@pytest.fixture
def disk(tmp_path):
    """A 64 MiB tmpfs of its own."""
    with tmpfs(tmp_path / "disk", "64m") as mount:
        yield mount


def cli(inputs: Path, out: Path) -> list[str]:
    return process_args(inputs, out, "--no-speakers", "--chunk-size", "4")


def child_started(run: Path, name: str) -> bool:
    log = run / f"{name}.log"
    return log.exists() and ": pid " in log.read_text()


def test_a_disk_that_fills_during_the_run_stops_it_cleanly_and_the_rerun_resumes(tmp_path, disk):
    inputs = tmp_path / "in"
    clips(inputs, 3, seconds=2.5)
    out = disk / "out"
    # Given a run whose ASR child has started, after the audio stage wrote its artifacts
    proc = subprocess.Popen(
        cli(inputs, out), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    run = wait_for(
        lambda: next((out / ".runs").glob("*"), None) if (out / ".runs").exists() else None,
        timeout=120,
        what="the run directory",
    )
    wait_for(
        lambda: child_started(run, "chunk001-asr-1") or proc.poll() is not None,
        timeout=300,
        what="the ASR child",
    )
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    # When the disk fills up before it writes its first transcript
    filler = fill(disk)
    stdout, stderr = proc.communicate(timeout=300)
    # Then the run stops by itself: one line says where and what to do, no traceback, the documented code
    assert proc.returncode == ExitCode.DISK_FULL, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    [line] = [line for line in stderr.splitlines() if line.startswith("STOPPED disk full: ")]
    assert "no space left" in line.lower() and "run the same command again to resume" in line
    assert "MiB free on" in line
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], "a half-written file was left"
    # When space is freed and the same command runs again
    filler.unlink()
    done = subprocess.run(cli(inputs, out), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    # Then every input completes, and what the first run finished (the audio stage) was not done again
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 3 and report["stopped"] is None
    assert {item["stages"]["audio"]["status"] for item in report["inputs"]} == {"reused"}
    events = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines() if line.strip()]
    audio = [e for e in events if e.get("stage") == "audio" and e.get("status") == "ok"]
    assert sorted(e["item"] for e in audio) == sorted(i["id"] for i in report["inputs"]), (
        "audio ran once each"
    )
    assert all((out / i["id"] / "transcript.json").exists() for i in report["inputs"])


def test_a_disk_full_before_the_run_is_a_usage_error_with_the_reason(tmp_path, disk):
    inputs = tmp_path / "in"
    clips(inputs, 1, seconds=2.0)
    fill(disk)
    done = subprocess.run(
        cli(inputs, disk / "out"), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == ExitCode.USAGE, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "No space left on device" in line and str(disk / "out") in line
