"""A real child's timeline: spawn to exit in phases that add up, and a warm child's wait made visible."""

from __future__ import annotations

import time

import pytest

from contracts import WorkItem
from orchestrator.process.executor import LocalExecutor
from orchestrator.process.hooks import default_hooks
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from tests.fixtures.stages import NoteArtifact
from tests.fixtures.stages_timed import HOST_S, IMPORT_S, LOAD_S, MODEL_S

SPEC = StageSpec("timed", "tests.fixtures.stages_timed", NoteArtifact)
#: scheduling noise allowed on a busy machine (seconds)
SLACK = 0.15


def _runner(tmp_path) -> StageRunner:
    executor = LocalExecutor(default_hooks(registry=ChildRegistry(tmp_path / "pids")))
    return StageRunner(executor, tmp_path / "run", env={}, device="cpu", max_signal_retries=0)


def _items(tmp_path, n: int) -> list[WorkItem]:
    return [
        WorkItem(id=f"i{k}", inputs={"source": str(k)}, output=str(tmp_path / f"i{k}.json"), fingerprint="f")
        for k in range(n)
    ]


def test_a_cold_childs_phases_add_up_to_its_spawn_to_exit(tmp_path):
    # Given a stage with known import, load, model and host seconds, run cold (no warm start)
    outcomes, run = _runner(tmp_path).run(SPEC, _items(tmp_path, 2))
    # When its record comes back
    assert all(o.ok for o in outcomes.values())
    (attempt,) = run.attempts
    t = attempt.timeline
    # Then every moment is there, in order (a cold child is handed its request before it is spawned)
    assert t.handed <= t.spawned < t.imported < t.loaded <= t.first_item < t.last_item < t.exited
    phases = t.phases()
    # the phases add up to spawn -> exit, which is the parent's wall for a cold child
    assert sum(phases.values()) == pytest.approx(t.exited - t.spawned, abs=1e-6)
    assert t.exited - t.spawned == pytest.approx(attempt.wall_s, abs=SLACK)
    assert phases["ready"] == 0.0
    # and each phase is what the child measured: imports inside start-up, load, compute
    assert IMPORT_S <= phases["start"] and attempt.import_s >= IMPORT_S
    assert phases["load"] == pytest.approx(attempt.load_s, abs=SLACK) and attempt.load_s >= LOAD_S
    assert phases["compute"] == pytest.approx(attempt.compute_s, abs=SLACK)
    # model time is what ran inside model_time (nested blocks once), host time the rest of compute
    assert attempt.model_s == pytest.approx(2 * MODEL_S, abs=SLACK)
    assert attempt.host_s == pytest.approx(attempt.compute_s - attempt.model_s)
    assert attempt.host_s >= 2 * HOST_S


def test_a_warm_childs_imports_and_wait_appear(tmp_path):
    # Given a warm child that has imported while "the previous stage" still computes, and waits half a second
    runner = _runner(tmp_path)
    warm = runner.warm_up(SPEC, chunk=1)
    deadline = time.monotonic() + 30
    while "imported ahead" not in warm.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # ready and waiting
    # When its request comes
    outcomes, run = runner.run(SPEC, _items(tmp_path, 1), warm=warm)
    (attempt,) = run.attempts
    t = attempt.timeline
    # Then its imports are counted (not the re-import's milliseconds), done before it was handed the request
    assert attempt.import_s >= IMPORT_S
    assert t.spawned < t.imported < t.handed < t.loaded < t.exited
    phases = t.phases()
    assert phases["ready"] >= 0.5, "it stood ready, waiting for its request"
    assert sum(phases.values()) == pytest.approx(t.exited - t.spawned, abs=1e-6)
    # the parent's wall starts at the request: the timeline holds the time before it
    assert t.exited - t.spawned > attempt.wall_s + IMPORT_S + 0.5
    assert t.exited - t.handed == pytest.approx(attempt.wall_s, abs=SLACK)
