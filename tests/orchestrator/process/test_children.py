"""Pid files of stage children and orphan cleanup, with real processes: a real pipeline parent killed mid-stage."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.process.pidfiles import ChildRecord, ChildRegistry
from tests.conftest import ROOT

#: a pipeline parent: runs the sleeper stage in a real spawned child through the real executor;
#: its children do not die with it (as on platforms without PR_SET_PDEATHSIG), so killing it leaves an orphan
PARENT = """
import sys
from pathlib import Path
from contracts import WorkItem
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.process.executor import LocalExecutor
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from orchestrator.process.hooks import default_hooks
from tests.fixtures.stages import FixtureSettings, NoteArtifact

tmp = Path(sys.argv[1])
hooks = default_hooks(registry=ChildRegistry(tmp / "pids"))
runner = StageRunner(LocalExecutor(hooks, die_with_parent=False), tmp / "run", env={}, device="cpu",
                     max_signal_retries=0)
item = WorkItem(id="a", inputs={"source": "x"}, output=str(tmp / "a" / "note.json"), fingerprint="fp")
settings = FixtureSettings(started=str(tmp / "started"), release=str(tmp / "release"), sleep_s=120)
outcomes, _ = runner.run(StageSpec("sleeper", "tests.fixtures.stages_sleeper", NoteArtifact, settings=settings), [item])
print("ok" if outcomes["a"].ok else "failed")
"""


def start_parent(tmp_path) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        if parent.poll() is not None or time.monotonic() > deadline:
            parent.kill()
            pytest.fail(f"the stage child did not start: {parent.communicate()[1][-2000:]}")
        time.sleep(0.05)
    time.sleep(0.05)
    return parent, int((tmp_path / "started").read_text())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_executor_records_a_running_child_and_removes_the_record_when_it_exits(tmp_path):
    parent, child = start_parent(tmp_path)
    registry = ChildRegistry(tmp_path / "pids")
    # While the child runs, its pid file names it, its start time and its parent
    [record] = registry.records()
    assert (record.pid, record.stage, record.parent_pid) == (child, "sleeper", parent.pid)
    assert record.create_time == pytest.approx(psutil.Process(child).create_time(), abs=0.05)
    # and cleanup leaves a child whose pipeline still runs alone
    done = registry.cleanup(grace_s=1)
    assert [r.pid for r in done.running] == [child] and not done.stopped and not gone(child)
    # When the stage finishes, the record is gone
    (tmp_path / "release").touch()
    out, err = parent.communicate(timeout=60)
    assert out.strip() == "ok", err[-2000:]
    assert registry.records() == []


def test_orphan_of_a_crashed_pipeline_is_stopped_and_reported(tmp_path):
    # Given a pipeline parent killed (SIGKILL: no cleanup of its own) while its stage child runs
    parent, child = start_parent(tmp_path)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    time.sleep(0.2)
    assert not gone(child), "a spawn child outlives its killed parent: the orphan this feature is for"
    registry = ChildRegistry(tmp_path / "pids")
    assert [r.pid for r in registry.orphans()] == [child]
    # When cleanup runs
    done = registry.cleanup(grace_s=5)
    # Then exactly that child was stopped, and said so
    assert [r.pid for r in done.stopped] == [child] and not done.failed
    assert gone(child)
    assert registry.records() == []


def test_a_recycled_pid_is_never_taken_for_our_child(tmp_path):
    # Given a pid file whose pid now belongs to an unrelated process (different start time)
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        registry = ChildRegistry(tmp_path / "pids")
        registry.directory.mkdir(parents=True)
        record = ChildRecord(
            pid=stranger.pid,
            create_time=psutil.Process(stranger.pid).create_time() - 1000,
            stage="asr",
            parent_pid=999999,
            parent_create_time=0.0,
            request="r",
            started_at=0.0,
        )
        (registry.directory / f"{stranger.pid}.json").write_text(json.dumps(record.__dict__))
        # When cleanup runs, Then the stranger lives and only the stale record goes
        done = registry.cleanup(grace_s=1)
        assert [r.pid for r in done.stale] == [stranger.pid] and not done.stopped
        assert stranger.poll() is None
        assert registry.records() == []
    finally:
        stranger.kill()
        stranger.wait()


def test_unreadable_pid_files_are_skipped(tmp_path, caplog):
    registry = ChildRegistry(tmp_path)
    (tmp_path / "123.json").write_text("{not json")
    assert registry.records() == [] and "unreadable pid file" in caplog.text


def test_missing_directory_means_no_children(tmp_path):
    assert ChildRegistry(tmp_path / "nope").cleanup().stopped == []
    assert isinstance(ChildRegistry().directory, Path)
