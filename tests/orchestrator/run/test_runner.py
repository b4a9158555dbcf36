"""The stage runner with real spawned children: OOM halving, signal retries, failures, logs."""

from __future__ import annotations

import json
import logging
import time

from contracts import StageRequest, WorkItem, load_model
from orchestrator.process.executor import LocalExecutor
from orchestrator.registry import StageSpec
from orchestrator.run.runner import StageRunner
from tests.fixtures.stages import FixtureSettings, NoteArtifact


def _items(tmp_path, sources: dict[str, str]) -> list[WorkItem]:
    return [
        WorkItem(id=k, inputs={"source": v}, output=str(tmp_path / k / "note.json"), fingerprint=f"fp-{k}")
        for k, v in sources.items()
    ]


def _runner(tmp_path, retries=2) -> StageRunner:
    return StageRunner(LocalExecutor(), tmp_path / "run", env={}, device="cpu", max_signal_retries=retries)


def _request(tmp_path, name, attempt) -> StageRequest:
    return load_model(tmp_path / "run" / f"chunk001-{name}-{attempt}.request.json", StageRequest)


def _note(tmp_path, item_id) -> NoteArtifact:
    return load_model(tmp_path / item_id / "note.json", NoteArtifact)


def test_real_cpu_oom_is_recovered_by_halving_and_finished_items_are_kept(tmp_path):
    # Given 3 items needing batch x (10, 10, 100) MiB, and 600 MiB of headroom,
    # When the stage starts at batch 8 (item c needs 800 MiB),
    runner = _runner(tmp_path)
    spec = StageSpec(
        "memhog",
        "tests.fixtures.stages_memhog",
        NoteArtifact,
        batch_size=8,
        settings=FixtureSettings(**{"headroom_mib": 600}),
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "10", "b": "10", "c": "100"}))
    # Then the child dies of a real allocator OOM, the next child gets batch 4 and only item c.
    assert [(a.batch_size, a.outcome) for a in report.attempts] == [(8, "oom"), (4, "ok")]
    assert [i.id for i in _request(tmp_path, "memhog", 2).items] == ["c"]
    assert all(o.ok for o in outcomes.values())
    assert _note(tmp_path, "a").batch_size == 8 and _note(tmp_path, "b").batch_size == 8
    assert _note(tmp_path, "c").batch_size == 4 and _note(tmp_path, "c").pid != _note(tmp_path, "a").pid
    assert outcomes["c"].retries == 1 and outcomes["c"].batch_size == 4
    assert "DefaultCPUAllocator" in (tmp_path / "run" / "chunk001-memhog-1.log").read_text()


def test_oom_at_batch_one_fails_with_advice(tmp_path):
    runner = _runner(tmp_path)
    spec = StageSpec(
        "memhog",
        "tests.fixtures.stages_memhog",
        NoteArtifact,
        batch_size=2,
        settings=FixtureSettings(**{"headroom_mib": 300}),
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"big": "2000"}))
    assert [a.batch_size for a in report.attempts] == [2, 1]
    assert not outcomes["big"].ok
    assert "batch size 1" in outcomes["big"].error and "smaller model" in outcomes["big"].error


def test_child_killed_by_sigkill_is_reported_and_retried_without_redoing_work(tmp_path):
    runner = _runner(tmp_path)
    spec = StageSpec(
        "killer",
        "tests.fixtures.stages_killer",
        NoteArtifact,
        batch_size=4,
        settings=FixtureSettings(**{"marker": str(tmp_path / "marker"), "kill_on": "b"}),
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "1", "b": "2", "c": "3"}))
    assert [(a.outcome, a.signal) for a in report.attempts] == [("killed", 9), ("ok", None)]
    assert [i.id for i in _request(tmp_path, "killer", 2).items] == ["b", "c"]
    assert all(o.ok for o in outcomes.values())
    assert _note(tmp_path, "a").pid != _note(tmp_path, "b").pid


def test_repeated_sigkill_gives_up_after_the_retry_bound(tmp_path):
    runner = _runner(tmp_path, retries=1)
    spec = StageSpec(
        "killer",
        "tests.fixtures.stages_killer",
        NoteArtifact,
        batch_size=1,
        settings=FixtureSettings(**{"marker": str(tmp_path / "marker"), "kill_on": "a", "always": True}),
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "1"}))
    assert [a.outcome for a in report.attempts] == ["killed", "killed"]
    assert not outcomes["a"].ok and "SIGKILL" in outcomes["a"].error


def test_python_error_in_child_fails_its_items_with_the_reason(tmp_path):
    outcomes, report = _runner(tmp_path).run(
        StageSpec("broken", "tests.fixtures.stages_broken", NoteArtifact),
        _items(tmp_path, {"a": "1", "b": "2"}),
    )
    assert [a.outcome for a in report.attempts] == ["error"]
    assert not outcomes["a"].ok and "weights.bin" in outcomes["a"].error


def test_bad_item_fails_alone_and_child_output_reaches_parent_log_with_stage_prefix(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="orchestrator.child")
    outcomes, report = _runner(tmp_path).run(
        StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact),
        _items(tmp_path, {"x": "bad", "y": "good"}),
    )
    assert len(report.attempts) == 1
    assert not outcomes["x"].ok and outcomes["x"].error == "x is bad input"
    assert outcomes["y"].ok
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.child"]
    assert "[picky] picky says hello from y" in lines
    assert any(
        line.startswith("[picky] stages.runtime.base: picky: x failed: x is bad input") for line in lines
    )


def test_valid_current_artifacts_are_reused_and_stale_ones_redone(tmp_path):
    spec = StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact)
    items = _items(tmp_path, {"x": "1", "y": "2"})
    _runner(tmp_path).run(spec, items)
    (tmp_path / "y" / "note.json").write_text("{ truncated")
    outcomes, report = _runner(tmp_path / "again").run(spec, items)
    assert outcomes["x"].reused and not outcomes["y"].reused and outcomes["y"].ok
    assert report.reused == 1 and [len(_request(tmp_path / "again", "picky", 1).items)] == [1]


def test_warm_child_becomes_the_first_child_or_is_stopped_when_nothing_is_left(tmp_path):
    runner = _runner(tmp_path)
    spec = StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact)
    items = _items(tmp_path, {"x": "1"})
    warm = runner.warm_up(spec, chunk=1)
    outcomes, report = runner.run(spec, items, warm=warm)
    assert outcomes["x"].ok and report.attempts[0].pid == warm.proc.pid
    assert "imported ahead" in (tmp_path / "run" / "chunk001-picky-1.log").read_text()

    again = _runner(tmp_path / "again")
    warm = again.warm_up(spec, chunk=1)
    outcomes, report = again.run(spec, items, warm=warm)  # x is current: no request will come
    assert outcomes["x"].reused and report.attempts == []
    assert warm.proc.exitcode is not None, "the warm child was stopped"


def test_a_warm_child_imports_with_the_environment_its_request_will_carry(tmp_path):
    """Some libraries read their settings once, on import (huggingface_hub's HF_HUB_OFFLINE): a warm child
    imports before its request exists, so it gets the run's environment when it starts."""
    runner = StageRunner(
        LocalExecutor(),
        tmp_path / "run",
        env={"PIPELINE_WARM_PROBE": "from the run"},
        device="cpu",
        max_signal_retries=2,
    )
    spec = StageSpec(
        "envprobe",
        "tests.fixtures.stages_envprobe",
        NoteArtifact,
        settings=FixtureSettings(names=["PIPELINE_WARM_PROBE"], at_import=True),
    )
    warm = runner.warm_up(spec, chunk=1)
    outcomes, report = runner.run(spec, _items(tmp_path, {"x": "1"}), warm=warm)
    assert outcomes["x"].ok and report.attempts[0].pid == warm.proc.pid
    seen = json.loads(_note(tmp_path, "x").text)
    assert (
        seen["at_import"]
        == {"PIPELINE_WARM_PROBE": "from the run"}
        == {"PIPELINE_WARM_PROBE": seen["PIPELINE_WARM_PROBE"]}
    )


class _Refuse:
    """A hook that refuses every child (as the GPU guard does on a full GPU) and notes whether the request
    was already on disk when it was asked."""

    def __init__(self) -> None:
        self.request_on_disk: list[bool] = []

    def before(self, child) -> str | None:
        self.request_on_disk.append(child.request_path.exists())
        return "refused by the test"

    def started(self, child) -> None:
        pass

    def exited(self, child) -> None:
        pass


def test_a_warm_child_never_sees_a_request_its_hooks_refuse(tmp_path):
    """A warm child starts the moment its request file appears: the file is written only after every hook's
    ``before`` (the GPU guard's check and baseline, the perf log's stage_start) has let the child go."""
    hook = _Refuse()
    runner = StageRunner(LocalExecutor([hook]), tmp_path / "run", env={}, device="cpu", max_signal_retries=0)
    spec = StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact)
    warm = runner.warm_up(spec, chunk=1)
    outcomes, report = runner.run(spec, _items(tmp_path, {"x": "1"}), warm=warm)
    assert hook.request_on_disk == [False]
    assert not outcomes["x"].ok and "refused by the test" in outcomes["x"].error
    assert [a.pid for a in report.attempts] == [None] and warm.proc.exitcode is not None
    assert not (tmp_path / "x" / "note.json").exists(), "the refused request was not run by the warm child"


class _RefuseFirst(_Refuse):
    """Refuses the first ``times`` starts (another process briefly holding the GPU), then lets children go."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    def before(self, child) -> str | None:
        return super().before(child) if len(self.request_on_disk) < self.times else None


def test_a_refused_start_is_a_temporary_condition_waited_out(tmp_path):
    """A refused start waits (bounded backoff) instead of failing the chunk at once."""
    hook = _RefuseFirst(1)
    runner = StageRunner(
        LocalExecutor([hook]),
        tmp_path / "run",
        env={},
        device="cpu",
        max_signal_retries=0,
        refused_wait_s=1.0,
    )
    spec = StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact)
    started = time.monotonic()
    outcomes, report = runner.run(spec, _items(tmp_path, {"x": "1", "y": "2"}))
    assert [a.outcome for a in report.attempts] == ["refused", "ok"]
    assert time.monotonic() - started >= 1.0, "it waited before trying again"
    assert all(o.ok for o in outcomes.values()) and outcomes["x"].retries == 1


def test_a_start_refused_for_longer_than_the_wait_fails_with_the_reason(tmp_path):
    runner = StageRunner(
        LocalExecutor([_Refuse()]),
        tmp_path / "run",
        env={},
        device="cpu",
        max_signal_retries=0,
        refused_wait_s=1.0,
    )
    spec = StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact)
    outcomes, report = runner.run(spec, _items(tmp_path, {"x": "1"}))
    assert [a.outcome for a in report.attempts] == ["refused", "refused"]
    assert not outcomes["x"].ok
    assert outcomes["x"].error == "picky was not started (refused 2 times over 1 s): refused by the test"


def test_an_error_exit_while_an_item_is_in_flight_fails_only_that_item(tmp_path):
    """A child that exits with an ordinary error fails only the input it was on, once proven
    (in flight at two such exits); the rest of the chunk is done."""
    spec = StageSpec(
        "killer",
        "tests.fixtures.stages_killer",
        NoteArtifact,
        batch_size=4,
        settings=FixtureSettings(marker=str(tmp_path / "marker"), kill_on="b", always=True, signal="exit1"),
    )
    outcomes, report = _runner(tmp_path).run(spec, _items(tmp_path, {"a": "1", "b": "2", "c": "3", "d": "4"}))
    assert [a.outcome for a in report.attempts] == ["error", "error", "ok"]
    assert not outcomes["b"].ok
    assert outcomes["b"].error.startswith("crashed the killer child 2 times: it exited with an error")
    assert "giving up on b" in outcomes["b"].error
    assert all(outcomes[i].ok for i in "acd")
    assert [i.id for i in _request(tmp_path, "killer", 3).items] == ["c", "d"]


# -- culprit isolation -------------------------------------------------------------------


def test_an_input_that_crashes_its_child_every_time_fails_alone(tmp_path):
    # Given a stage that segfaults whenever it reaches input b (a poison input), in a chunk of four
    spec = StageSpec(
        "killer",
        "tests.fixtures.stages_killer",
        NoteArtifact,
        batch_size=4,
        settings=FixtureSettings(marker=str(tmp_path / "marker"), kill_on="b", always=True, signal="SIGSEGV"),
    )
    outcomes, report = _runner(tmp_path).run(spec, _items(tmp_path, {"a": "1", "b": "2", "c": "3", "d": "4"}))
    # Then b, in flight at both deaths, fails alone with the reason; the others are done
    assert [(a.outcome, a.signal) for a in report.attempts] == [("killed", 11), ("killed", 11), ("ok", None)]
    assert not outcomes["b"].ok
    assert (
        outcomes["b"].error
        == "crashed the killer child 2 times: it was killed by SIGSEGV while on this input"
    )
    assert all(outcomes[i].ok for i in "acd")
    assert [i.id for i in _request(tmp_path, "killer", 3).items] == ["c", "d"]


def test_a_hung_input_is_stopped_by_the_watchdog_and_fails_alone(tmp_path):
    from orchestrator.process.executor import Watchdog

    runner = StageRunner(
        LocalExecutor(watchdog=Watchdog(floor_s=2.0, per_audio_s=0.0)),
        tmp_path / "run",
        env={},
        device="cpu",
        max_signal_retries=2,
        max_item_crashes=1,
    )
    spec = StageSpec(
        "hanger", "tests.fixtures.stages_hanger", NoteArtifact, settings=FixtureSettings(hang_on="b")
    )
    outcomes, report = runner.run(spec, _items(tmp_path, {"a": "1", "b": "2", "c": "3"}))
    assert [a.outcome for a in report.attempts] == ["killed", "ok"]
    assert not outcomes["b"].ok and "hung (no progress within the watchdog's limit)" in outcomes["b"].error
    assert outcomes["a"].ok and outcomes["c"].ok


def test_an_input_too_big_even_at_batch_one_fails_alone_and_the_rest_go_back_to_the_batch_that_worked(
    tmp_path,
):
    # Given 600 MiB of headroom and inputs needing batch x (10, 2000, 10, 10) MiB, starting at batch 4
    spec = StageSpec(
        "memhog",
        "tests.fixtures.stages_memhog",
        NoteArtifact,
        batch_size=4,
        settings=FixtureSettings(headroom_mib=600),
    )
    outcomes, report = _runner(tmp_path).run(
        spec, _items(tmp_path, {"a": "10", "b": "2000", "c": "10", "d": "10"})
    )
    # Then b runs out of memory at 4, 2 and 1 (real allocator OOMs), fails alone with advice,
    assert [(a.batch_size, a.outcome) for a in report.attempts] == [
        (4, "oom"),
        (2, "oom"),
        (1, "oom"),
        (4, "ok"),
    ]
    assert not outcomes["b"].ok and "even at batch size 1: try a smaller model" in outcomes["b"].error
    # and c, d run at batch 4, the largest size that finished an input (a), not stuck at 1
    assert _note(tmp_path, "c").batch_size == 4 and _note(tmp_path, "d").batch_size == 4
    assert all(outcomes[i].ok for i in "acd")
