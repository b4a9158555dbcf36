"""Crash and resume: kill -9 of a stage child and of the parent, then the same command again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, process_args, wait_for
from tests.fixtures.generate import clips
from tests.orchestrator.process.test_children import gone

pytestmark = pytest.mark.slow


def cli(out: Path, inputs: Path) -> list[str]:
    return process_args(inputs, out, "--chunk-size", "4", "--embedding-profile", "embedded")


#: no joined ASR windows: a respawned child decodes the inputs left with other neighbours, and an input's
#: text may move with the inputs that share its window; these tests compare texts exactly, and need the first
#: transcript written before the last (joined, four 2.5 s clips finish together)
ENV = {**os.environ, "ASR_JOIN_INPUTS": "false"}


def run(out: Path, inputs: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cli(out, inputs), cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)


def start(out: Path, inputs: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cli(out, inputs), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=ENV
    )


def run_dir(out: Path) -> Path | None:
    runs = sorted((out / ".runs").glob("*")) if (out / ".runs").exists() else []
    return runs[-1] if runs else None


def child_pid(log: Path) -> int | None:
    """The pid a stage child logs first thing ("<stage>: pid N, attempt ...")."""
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        if ": pid " in line:
            return int(line.split(": pid ")[1].split(",")[0])
    return None


def outputs(out: Path) -> dict[str, tuple[list[str], np.ndarray]]:
    result = {}
    # ids mirror the input folder: OUT/<folder>/<stem>/
    for transcript in sorted(out.rglob("transcript.json")):
        texts = [s["text"] for s in json.loads(transcript.read_text())["segments"]]
        result[transcript.parent.name] = (texts, np.load(transcript.parent / "embeddings.npy"))
    return result


def assert_same_outputs(a: Path, b: Path) -> None:
    left, right = outputs(a), outputs(b)
    assert sorted(left) == sorted(right) and len(left) == 8
    for name in left:
        assert left[name][0] == right[name][0], name
        np.testing.assert_allclose(left[name][1], right[name][1], atol=1e-5)


def requested_ids(directory: Path, stage: str) -> list[str]:
    ids = []
    for request in sorted(directory.glob(f"*{stage}-*.request.json")):
        ids += [item["id"] for item in json.loads(request.read_text())["items"]]
    return ids


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("in")
    clips(directory, 8, seconds=2.5)
    return directory


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> Path:
    out = tmp_path_factory.mktemp("reference")
    done = run(out, inputs)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_kill_9_of_a_stage_child_is_retried_and_gives_the_same_outputs(tmp_path, inputs, reference):
    out = tmp_path / "out"
    proc = start(out, inputs, tmp_path / "parent.log")
    directory = wait_for(lambda: run_dir(out), what="run directory")
    progress = directory / "chunk001-asr-1.items.jsonl"
    # Given the ASR child of chunk 1 has finished at least one item (and not all four)
    wait_for(lambda: progress.exists() and progress.read_text().count("\n") >= 1, what="first transcript")
    pid = child_pid(directory / "chunk001-asr-1.log")
    # When it is killed with SIGKILL
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), timeout=30, what="the killed child to be gone")
    done_before = progress.read_text().count("\n")  # final: a dead child writes no more
    assert done_before < 4, "the child had finished every item before the kill: nothing to retry"
    assert proc.wait(timeout=600) == 0, (tmp_path / "parent.log").read_text()[-3000:]
    # Then the parent reported the signal, respawned it for the items it had not finished, and all completed
    report = json.loads((out / "run-report.json").read_text())
    asr = next(run for run in report["stages"] if run["stage"] == "asr" and run["chunk"] == 1)
    assert [(a["outcome"], a["signal"]) for a in asr["attempts"]][:2] == [("killed", 9), ("ok", None)]
    assert asr["attempts"][1]["items"] == 4 - done_before
    assert report["ok"] == 8
    assert_same_outputs(out, reference)


def test_kill_9_of_the_parent_then_rerun_resumes_without_redoing_complete_inputs(tmp_path, inputs, reference):
    out = tmp_path / "out"
    proc = start(out, inputs, tmp_path / "parent.log")
    directory = wait_for(lambda: run_dir(out), what="run directory")
    # Given chunk 1 is complete and chunk 2's ASR child is working
    wait_for(
        lambda: (directory / "chunk002-asr-1.log").exists() and child_pid(directory / "chunk002-asr-1.log"),
        what="chunk 2 ASR child",
    )
    child = child_pid(directory / "chunk002-asr-1.log")
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    complete = {e["item"] for e in journal if e["stage"] == "outputs" and e["status"] == "ok"}
    assert len(complete) == 4
    # When the parent is killed with SIGKILL
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # Then its stage child does not live on as an orphan
    wait_for(
        lambda: (
            not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        ),
        timeout=10,
        what="the orphaned child to die",
    )

    # When the same command runs again
    done = run(out, inputs)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "run-report.json").read_text())
    second = run_dir(out)
    assert second != directory
    # Then no complete input was processed again, by any stage
    for stage in ("audio", "asr", "embeddings"):
        assert not complete & set(requested_ids(second, stage)), stage
    for item in report["inputs"]:
        if item["id"] in complete:
            assert {s["status"] for s in item["stages"].values()} == {"reused"}
    assert report["ok"] == 8 and "resuming: 4 of 8 input(s)" in done.stderr
    assert_same_outputs(out, reference)
