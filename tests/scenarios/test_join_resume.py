"""A join group redone in part after its other inputs finished: the inputs redone get the words of a clean run.

A finished input's decoded audio (``.work/``) is removed. When one of its join group's inputs is redone later
(it failed or was killed before its ASR finished while the others completed), the ASR child must still hear
the group as planned: the finished partners' audio is decoded again for it (and removed again after),
their artifacts and outputs left as they are. Real ``bin/pipeline`` runs, the embedded Whisper."""

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
IDS = [f"clips/clip{i:03d}" for i in range(4)]
#: the inputs a kill left without their transcript (the group's others finished)
REDONE = ["clips/clip001", "clips/clip002"]


def cli(out: Path, inputs: Path) -> list[str]:
    return process_args(inputs, out, "--chunk-size", "5", "--no-speakers", "--embedding-profile", "embedded")


def run(out: Path, inputs: Path) -> None:
    done = subprocess.run(cli(out, inputs), cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]


def transcripts(out: Path) -> dict[str, str]:
    """Each input's transcript: its segments (text and timed words) and its transcript.txt."""
    found = {}
    for path in sorted(out.rglob("transcript.json")):
        segments = json.loads(path.read_text())["segments"]
        found[f"{path.parent.parent.name}/{path.parent.name}"] = (
            json.dumps([[s["text"], s.get("words")] for s in segments])
            + (path.parent / "transcript.txt").read_text()
        )
    return found


def asr_requests(out: Path, before: set[Path]) -> list[dict]:
    """The ASR requests (each child's) of the runs not in ``before``, with the log of the child that got it."""
    return [
        {
            "request": json.loads(path.read_text()),
            "log": path.with_name(path.name.replace(".request.json", ".log")).read_text(),
        }
        for directory in sorted(set((out / ".runs").iterdir()) - before)
        for path in sorted(directory.glob("chunk*-asr-*.request.json"))
    ]


def killed_before_asr(out: Path) -> dict[str, int]:
    """What a kill before their ASR finished leaves of :data:`REDONE` (nothing of theirs is complete) while
    the group's other inputs finished (their scratch removed); the others' files' mtimes."""
    for item in REDONE:
        shutil.rmtree(out / item)
    return {
        str(p): p.stat().st_mtime_ns for item in IDS if item not in REDONE for p in (out / item).iterdir()
    }


def assert_redone_as_planned(
    out: Path, reference: dict[str, str], untouched: dict[str, int], before: set[Path]
) -> None:
    # every transcript is the clean run's, text and words
    assert transcripts(out) == reference
    # each ASR request since named the whole group, and its child read every partner's audio
    requests = asr_requests(out, before)
    assert requests
    asked = set()
    for asr in requests:
        for item in asr["request"]["items"]:
            asked.add(item["id"])
            assert [m[0] for m in json.loads(item["inputs"]["join_members"])] == IDS
        assert "has no audio" not in asr["log"]
    assert asked == set(REDONE)
    # the finished partners: their files untouched, their scratch removed again
    assert {p: Path(p).stat().st_mtime_ns for p in untouched} == untouched
    for item in IDS:
        assert not (out / item / ".work" / "audio.npy").exists(), item


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    # four clips of 2.5 s cut from one sentence (words cut at both ends: their neighbours change what
    # Whisper hears), one join group
    directory = tmp_path_factory.mktemp("in") / "clips"
    clips(directory, 4, seconds=2.5)
    return directory


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> tuple[Path, dict[str, str]]:
    out = tmp_path_factory.mktemp("reference") / "out"
    run(out, inputs)
    found = transcripts(out)
    assert sorted(found) == IDS and all(found.values())
    groups = json.loads((out / ".join-groups.json").read_text())["groups"]
    assert set(groups.values()) == {"g1"}
    return out, found


def test_inputs_redone_after_their_group_finished_get_the_clean_runs_words(tmp_path, inputs, reference):
    # Given a finished folder in which two inputs of the group were left without anything (a kill before
    # their ASR finished), the others complete and their decoded audio removed
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    untouched = killed_before_asr(out)
    before = set((out / ".runs").iterdir())
    # When the same command runs again
    run(out, inputs)
    # Then they were decoded with the whole group, as planned, and got the clean run's words
    assert_redone_as_planned(out, reference[1], untouched, before)


def test_a_kill_inside_the_asr_child_of_a_group_redone_in_part_changes_no_word(tmp_path, inputs, reference):
    # Given the same folder, two inputs of the group to redo
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    untouched = killed_before_asr(out)
    before = set((out / ".runs").iterdir())
    proc = subprocess.Popen(
        cli(out, inputs), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    directory = wait_for(lambda: run_dir(out) if run_dir(out) not in before else None, what="the run")
    # When the run and its ASR child are killed with SIGKILL while the child works, and the same command
    # runs again
    pid = wait_for(lambda: child_pid(directory / "chunk001-asr-1.log"), what="the ASR child")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), timeout=30, what="the ASR child to be gone")
    run(out, inputs)
    # Then the inputs redone still got the clean run's words, the partners' scratch removed again
    assert_redone_as_planned(out, reference[1], untouched, before)


def _recorded(out: Path, stage: str, skip: int) -> bool:
    """Every input's outcome of ``stage`` is in the journal, after its first ``skip`` lines."""
    path = out / "journal.jsonl"
    if not path.exists():
        return False
    events = [json.loads(line) for line in path.read_text().splitlines()[skip:] if line.endswith("}")]
    return {e["item"] for e in events if e["stage"] == stage} >= set(IDS)


def test_a_crash_at_each_stage_boundary_changes_no_word(tmp_path, inputs, reference):
    # Given the clean run's stages, in order (the journal of the reference run)
    events = [json.loads(line) for line in (reference[0] / "journal.jsonl").read_text().splitlines()]
    stages = list(dict.fromkeys(e["stage"] for e in events if e["stage"] != "outputs"))
    assert stages[:2] == ["audio", "asr"] and len(stages) >= 3, stages
    out = tmp_path / "out"
    for stage in stages[:-1]:
        # When the run, with every child it started, is killed with SIGKILL (a crash of the machine) as soon
        # as the journal holds every input's outcome of ``stage``: between it and the next stage (a stage
        # done in the parent at once, as alignment without a wav2vec2 aligner, may be past too)
        skip = (
            len((out / "journal.jsonl").read_text().splitlines()) if (out / "journal.jsonl").exists() else 0
        )
        proc = subprocess.Popen(
            cli(out, inputs),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=ENV,
            start_new_session=True,
        )
        try:
            wait_for(lambda s=stage, k=skip, p=proc: _recorded(out, s, k) or p.poll() is not None, what=stage)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # (a run that ended first had no outcome of ``stage`` to record: the killed run before it had done
        # it, past the journal, as a stage done in the parent at once can be)
        ended = _recorded(out, "outputs", skip)
        assert not (ended and _recorded(out, stage, skip)), f"the run ended before the kill after {stage}"
    # and the same command runs once more to the end
    run(out, inputs)
    # Then every transcript is the clean run's, text and words
    assert transcripts(out) == reference[1]


def test_a_random_kill_of_the_asr_child_inside_a_joined_window_changes_no_word(tmp_path, inputs, reference):
    # Given a run of the group from nothing
    out = tmp_path / "out"
    proc = subprocess.Popen(
        cli(out, inputs), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, text=True
    )
    directory = wait_for(lambda: run_dir(out), what="the run")

    def joined_in_flight():
        path = directory / "chunk001-asr-1.inflight.json"
        try:
            return len(json.loads(path.read_text())["ids"]) > 1
        except (OSError, ValueError):
            return False

    # When its ASR child alone is killed with SIGKILL while a joined window of several inputs is in flight
    wait_for(joined_in_flight, what="a joined window in flight")
    pid = child_pid(directory / "chunk001-asr-1.log")
    os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=600)
    # Then the run respawned the child, which joined the windows as planned: every word is the clean run's
    assert proc.returncode == 0, stderr[-3000:]
    retry = json.loads((directory / "chunk001-asr-2.request.json").read_text())
    assert retry["attempt"] == 2 and retry["isolate"] == []
    assert transcripts(out) == reference[1]
