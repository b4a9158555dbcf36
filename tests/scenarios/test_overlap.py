"""Overlapped chunks (``PIPELINE_OVERLAP_CHUNKS=on``): the next chunk's audio stage runs while this chunk's
GPU stages run; a graceful stop meanwhile, then the same command again, redoes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, process_args, wait_for
from tests.fixtures.generate import clips
from tests.scenarios.test_resume import requested_ids, run_dir

pytestmark = pytest.mark.slow

#: exact texts compared between runs: no joined ASR windows (an input's text may move with its neighbours)
ENV = {**os.environ, "ASR_JOIN_INPUTS": "false", "PIPELINE_OVERLAP_CHUNKS": "on"}


def cli(inputs: Path, out: Path) -> list[str]:
    return process_args(inputs, out, "--chunk-size", "2", "--embedding-profile", "embedded")


def texts(out: Path) -> dict[str, list[str]]:
    return {
        t.parent.name: [s["text"] for s in json.loads(t.read_text())["segments"]]
        for t in sorted(out.rglob("transcript.json"))
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("in")
    clips(directory, 6, seconds=2.5)
    return directory


@pytest.fixture(scope="module")
def overlapped(tmp_path_factory, inputs) -> Path:
    out = tmp_path_factory.mktemp("overlapped")
    done = subprocess.run(cli(inputs, out), cwd=ROOT, capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_next_chunks_audio_runs_while_this_chunks_later_stages_run(overlapped):
    report = json.loads((overlapped / "run-report.json").read_text())
    assert report["ok"] == 6 and report["failed"] == 0
    runs = {(run["chunk"], run["stage"]): run for run in report["stages"]}

    def moments(run: dict, key: str) -> list[float]:
        return [a["timeline"][key] for a in run["attempts"] if a.get("timeline") and a["timeline"].get(key)]

    for chunk in (2, 3):
        audio_started = min(moments(runs[(chunk, "audio")], "spawned"))
        previous_ended = max(
            t for (c, _), run in runs.items() if c == chunk - 1 for t in moments(run, "exited")
        )
        previous_audio = max(moments(runs[(chunk - 1, "audio")], "exited"))
        # chunk N's audio child started once chunk N-1's audio ended, before chunk N-1's last stage ended
        assert previous_audio <= audio_started < previous_ended, chunk
    assert len(texts(overlapped)) == 6 and all(texts(overlapped).values())


def test_a_stop_while_the_next_chunk_runs_ahead_resumes_with_nothing_redone(tmp_path, inputs, overlapped):
    out = tmp_path / "out"
    log = tmp_path / "parent.log"
    proc = subprocess.Popen(
        cli(inputs, out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=ENV
    )
    directory = wait_for(lambda: run_dir(out), what="run directory")
    ahead = directory / "chunk002-audio-1.items.jsonl"
    # Given chunk 2's audio child has decoded an input while chunk 1 is not finished
    wait_for(lambda: ahead.exists() and ahead.read_text().count("\n") >= 1, timeout=300, what="chunk 2 audio")
    # When the run is asked to stop (the first Ctrl-C)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    decoded = {e["item"] for e in journal if e["stage"] == "audio" and e["status"] == "ok"}
    finished = {e["item"] for e in journal if e["stage"] == "outputs" and e["status"] == "ok"}
    assert decoded - finished, "no input was decoded ahead and left unfinished: nothing to resume"

    # When the same command runs again
    done = subprocess.run(cli(inputs, out), cwd=ROOT, capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    second = run_dir(out)
    assert second != directory
    # Then nothing decoded in the first run is decoded again, and nothing finished is redone at all
    assert not decoded & set(requested_ids(second, "audio"))
    for stage in ("asr", "embeddings"):
        assert not finished & set(requested_ids(second, stage)), stage
    report = json.loads((out / "run-report.json").read_text())
    assert report["ok"] == 6
    assert texts(out) == texts(overlapped)
