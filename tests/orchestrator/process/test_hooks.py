"""The executor's watch around real stage children: refusal on a full GPU, leak errors, the performance log."""

from __future__ import annotations

import logging

from contracts import WorkItem
from contracts.perf import PERF_LOG_ENV, read_events
from contracts.units import GIB_MIB as GIB
from orchestrator.gpu.guard import GpuMonitor
from orchestrator.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot, RecordedReader
from orchestrator.process.executor import LocalExecutor
from orchestrator.process.hooks import default_hooks
from orchestrator.process.pidfiles import ChildRegistry
from orchestrator.registry import BY_NAME, StageSpec
from orchestrator.run.runner import StageRunner
from orchestrator.settings import Settings
from tests.fixtures.stages import FixtureSettings, NoteArtifact


def card(used: float, processes=()) -> GpuSnapshot:
    total = 14.74 * GIB
    return GpuSnapshot(
        available=True,
        devices=[
            GpuDevice(
                index=0,
                name="Tesla T4",
                total_mib=total,
                used_mib=used,
                free_mib=total - used,
                processes=list(processes),
            )
        ],
    )


def _runner(tmp_path, readings, env=None) -> StageRunner:
    monitor = GpuMonitor(RecordedReader(readings), sample_s=None, settle_s=0.3)
    watch = default_hooks(registry=ChildRegistry(tmp_path / "pids"), monitor=monitor)
    return StageRunner(
        LocalExecutor(watch), tmp_path / "run", env=env or {}, device="auto", max_signal_retries=0
    )


def _items(tmp_path, *ids):
    return [
        WorkItem(id=i, inputs={"source": "good"}, output=str(tmp_path / i / "note.json"), fingerprint="fp")
        for i in ids
    ]


def test_stage_is_not_started_on_a_gpu_another_process_fills(tmp_path):
    # Given seed 004's card: another process holds 14.17 GiB of a 14.74 GiB T4
    trainer = GpuProcess(pid=75955, used_mib=14.17 * GIB, command="python3 train.py")
    runner = _runner(tmp_path, [card(14.5 * GIB, [trainer])])
    # (the asr stage's real settings from the registry, run by a fixture stage that accepts any settings)
    spec = StageSpec(
        "asr",
        "tests.fixtures.stages_picky",
        NoteArtifact,
        settings=BY_NAME["asr"].build(Settings(asr_model="large-v3")),
    )
    # When the asr stage (large-v3 needs ~4.6 GiB) is run
    outcomes, report = runner.run(spec, _items(tmp_path, "a", "b"))
    # Then no child starts and each item fails with who holds the memory
    assert [a.pid for a in report.attempts] == [None]
    assert not list((tmp_path / "run").glob("*.result.json"))
    for outcome in outcomes.values():
        assert not outcome.ok
        assert "Process 75955 (python3 train.py) has 14.17 GiB memory in use" in outcome.error
        assert "has only 0.24 GiB free" in outcome.error


def test_memory_not_back_after_a_child_is_a_leak_error_in_log_and_report(tmp_path, caplog):
    # Given device usage that is 3.5 GiB above its baseline after the child exited
    runner = _runner(tmp_path, [card(500), card(4000)])
    with caplog.at_level(logging.ERROR, logger="orchestrator.gpu.guard"):
        outcomes, report = runner.run(
            StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact), _items(tmp_path, "a")
        )
    assert outcomes["a"].ok
    [attempt] = report.attempts
    assert attempt.gpu_leak and attempt.gpu_leak.startswith(
        "picky: GPU memory leak: GPU 0 usage did not return"
    )
    assert attempt.gpu_tree_after_mib == 0.0
    assert "picky: GPU memory leak" in caplog.text


def test_clean_exit_records_the_zero_mib_proof(tmp_path):
    runner = _runner(tmp_path, [card(500), card(520)])
    _, report = runner.run(
        StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact), _items(tmp_path, "a")
    )
    [attempt] = report.attempts
    assert attempt.gpu_leak is None and attempt.gpu_tree_after_mib == 0.0


def test_performance_log_gets_parent_and_child_events_in_order(tmp_path):
    perf = tmp_path / "performance_logs" / "run.jsonl"
    runner = _runner(tmp_path, [card(500), card(510)], env={PERF_LOG_ENV: str(perf)})
    runner.run(StageSpec("picky", "tests.fixtures.stages_picky", NoteArtifact), _items(tmp_path, "a", "b"))
    events = read_events(perf)
    assert [(e.event, getattr(e, "point", None)) for e in events] == [
        ("stage_start", None),
        ("checkpoint", "before model load"),
        ("checkpoint", "model loaded"),
        ("checkpoint", "before exit"),
        ("gpu_check", None),
        ("stage_end", None),
    ]
    start, end = events[0], events[-1]
    assert (start.stage, start.attempt, start.batch_size, start.items) == ("picky", 1, 1, 2)
    record = end.record
    assert record.outcome == "ok" and record.ok == 2 and record.failed == 0 and record.items_per_s > 0
    assert record.wall_s > 0 and end.pid == record.pid == events[1].pid
    assert [e.t for e in events] == sorted(e.t for e in events)


def test_a_respawn_is_logged_as_a_retry_with_the_new_batch_size(tmp_path):
    perf = tmp_path / "perf.jsonl"
    runner = _runner(tmp_path, [card(500)], env={PERF_LOG_ENV: str(perf)})
    spec = StageSpec(
        "memhog",
        "tests.fixtures.stages_memhog",
        NoteArtifact,
        batch_size=8,
        settings=FixtureSettings(**{"headroom_mib": 600}),
    )
    items = [
        WorkItem(id=k, inputs={"source": v}, output=str(tmp_path / k / "note.json"), fingerprint="fp")
        for k, v in {"a": "10", "c": "100"}.items()
    ]
    runner.run(spec, items)
    [retry] = [e for e in read_events(perf) if e.event == "retry"]
    assert (retry.attempt, retry.batch_size, retry.previous_outcome, retry.previous_batch_size) == (
        2,
        4,
        "oom",
        8,
    )
    ends = [(e.attempt, e.record.outcome) for e in read_events(perf) if e.event == "stage_end"]
    assert ends == [(1, "oom"), (2, "ok")]
    at_failure = [e for e in read_events(perf) if e.event == "checkpoint" and e.point == "at failure"]
    assert len(at_failure) == 1 and at_failure[0].attempt == 1
