"""Ctrl-C: the first finishes the current item and stops; the second stops the children now."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, process_args
from tests.fixtures.generate import clips
from tests.scenarios.test_resume import child_pid, run_dir, wait_for

pytestmark = pytest.mark.slow

#: each input's windows decoded alone, so that "the current item" is one input: joined, the six short
#: clips share one Whisper window and finish together (stopping between joined windows is the same rule)
ENV = {**os.environ, "ASR_JOIN_INPUTS": "false"}


def start(out: Path, inputs: Path, module: str = "orchestrator.cli") -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "process",
            str(inputs),
            "--output",
            str(out),
            "--chunk-size",
            "8",
            "--embedding-profile",
            "embedded",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("in")
    clips(directory, 6, seconds=2.0)
    return directory


def _asr_started_working(out: Path) -> Path:
    directory = wait_for(lambda: run_dir(out), what="run directory")
    progress = directory / "chunk001-asr-1.items.jsonl"
    wait_for(lambda: progress.exists() and progress.read_text().count("\n") >= 1, what="first transcript")
    return directory


def _stop_gracefully(out: Path, inputs: Path, sig: int, code: int, said: str) -> list[dict]:
    """Start a run, send ``sig`` once the ASR child works, check the graceful stop; the ASR items it finished."""
    proc = start(out, inputs)
    directory = _asr_started_working(out)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-2000:]
    assert f"{said}: finishing the current item" in err
    report = json.loads((out / "run-report.json").read_text())
    asr = [json.loads(line) for line in (directory / "chunk001-asr-1.items.jsonl").read_text().splitlines()]
    # the ASR child stopped between items: some done (whole artifacts), the rest left for later
    assert 1 <= len(asr) < 6 and all(item["ok"] for item in asr)
    assert report["interrupted"] == 6 and report["ok"] == 0
    assert all((out / item["id"] / "asr.json").is_file() for item in asr)  # the raw ASR transcript
    return asr


def test_first_ctrl_c_finishes_the_current_item_then_a_rerun_resumes(tmp_path, inputs):
    out = tmp_path / "out"
    asr = _stop_gracefully(out, inputs, signal.SIGINT, 130, "Ctrl-C")

    done = subprocess.run(
        process_args(inputs, out, "--chunk-size", "8", "--embedding-profile", "embedded"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads((run_dir(out) / "chunk001-asr-1.request.json").read_text())
    assert {i["id"] for i in again["items"]}.isdisjoint({i["id"] for i in asr}), (
        "finished transcripts are not redone"
    )


def test_second_ctrl_c_stops_the_children_now(tmp_path):
    """The ASR child is stuck on its second input (``tests.fixtures.stages_chaos`` hangs on ``hang-*``): the
    first Ctrl-C cannot end the run by itself, so the second one always finds the child working."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (first,) = clips(inputs, 1)
    shutil.copy(first, inputs / "hang-1.wav")  # sorted after clip000.wav
    out = tmp_path / "out"
    proc = start(out, inputs, module="tests.fixtures.chaos_driver")
    directory = _asr_started_working(out)
    child = child_pid(directory / "chunk001-asr-1.log")
    proc.send_signal(signal.SIGINT)
    # two signals sent back to back may be merged by the kernel: send the second once the first was handled
    wait_for(lambda: (directory / "STOP").exists(), timeout=30, what="the first Ctrl-C to be handled")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Ctrl-C again" in err
    wait_for(lambda: not Path(f"/proc/{child}").exists(), timeout=10, what="the ASR child to be gone")
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 0 and report["interrupted"] == 2


def test_sigterm_stops_like_the_first_ctrl_c_writes_the_report_and_exits_143(tmp_path, inputs):
    _stop_gracefully(tmp_path / "out", inputs, signal.SIGTERM, 143, "SIGTERM")
