"""Joined ASR windows through bin/pipeline: an input's transcript does not depend on which inputs share its
window by chance (the chunk size, a kill and resume, one more file), only on its join group."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, process_args, wait_for
from tests.fixtures.generate import clips
from tests.orchestrator.process.test_children import gone
from tests.scenarios.test_resume import child_pid, run_dir

pytestmark = pytest.mark.slow

#: joined windows on (the default), whatever the environment says
ENV = {**os.environ, "ASR_JOIN_INPUTS": "true"}


def cli(out: Path, inputs: Path, chunk_size: int, *extra: str) -> list[str]:
    return process_args(
        inputs,
        out,
        "--chunk-size",
        str(chunk_size),
        "--no-speakers",
        "--embedding-profile",
        "embedded",
        *extra,
    )


def run(out: Path, inputs: Path, chunk_size: int, *extra: str) -> None:
    done = subprocess.run(
        cli(out, inputs, chunk_size, *extra), cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]


def texts(out: Path) -> dict[str, bytes]:
    """Each input's transcript text, as bytes: its segments' texts and its transcript.txt."""
    found = {}
    for transcript in sorted(out.rglob("transcript.json")):
        segments = [s["text"] for s in json.loads(transcript.read_text())["segments"]]
        found[transcript.parent.name] = (
            json.dumps(segments).encode() + (transcript.parent / "transcript.txt").read_bytes()
        )
    return found


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    # twelve clips of 2.5 s cut from one sentence at different offsets (words cut at both ends: the hardest
    # neighbours to keep apart), all joined into shared windows
    directory = tmp_path_factory.mktemp("in") / "clips"
    clips(directory, 12, seconds=2.5)
    return directory


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path_factory.mktemp("reference") / "out"
    run(out, inputs, 5)
    found = texts(out)
    assert len(found) == 12 and all(found.values())
    return out, found


def test_another_chunk_size_gives_the_same_transcripts(tmp_path, inputs, reference):
    # Given a clean run in chunks of 5 (join groups of 5: 5 + 5 + 2); When the same folder runs in one chunk of 50
    run(tmp_path / "out", inputs, 50)
    # Then every input's transcript is byte for byte the same
    assert texts(tmp_path / "out") == reference[1]
    groups = json.loads((tmp_path / "out" / ".join-groups.json").read_text())["groups"]
    assert sorted(groups.values()) == ["g1"] * 5 + ["g2"] * 5 + ["g3"] * 2


def test_a_run_killed_during_asr_and_resumed_gives_the_same_transcripts(tmp_path, inputs, reference):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        cli(out, inputs, 5), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    directory = wait_for(lambda: run_dir(out), what="run directory")
    log = directory / "chunk001-asr-1.log"
    # Given the first chunk's ASR child is at work (its group's inputs partly written, or not yet)
    pid = wait_for(lambda: child_pid(log), what="the ASR child")
    # When the whole run is killed with SIGKILL, and the same command runs again
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: gone(pid), timeout=30, what="the ASR child to be gone")
    run(out, inputs, 5)
    # Then every input's transcript is byte for byte the clean run's
    assert texts(out) == reference[1]


def test_one_more_file_leaves_the_others_transcripts_as_they_were(tmp_path, inputs, reference):
    # Given the reference output folder, When one more file lands between the others in the input folder and
    # everything is redone
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    extra = inputs / "clip005b.wav"
    shutil.copy(inputs / "clip000.wav", extra)
    try:
        run(out, inputs, 5, "--force")
    finally:
        extra.unlink()
    # Then the twelve keep their groups and their transcripts byte for byte; the new one has a group of its own
    found = texts(out)
    assert set(found) == {*reference[1], "clip005b"}
    assert {k: v for k, v in found.items() if k != "clip005b"} == reference[1]
    groups = json.loads((out / ".join-groups.json").read_text())["groups"]
    assert groups["clips/clip005b"] == "g4"
