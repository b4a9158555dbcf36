"""Where a run's wall went: the exposed-time union and a stage's wait, as pure functions."""

from __future__ import annotations

import pytest

from contracts.report import Attempt, ChildTimeline, StageRun
from orchestrator.telemetry.timings import computing, exposure, last_exit, stage_times, waited


def _child(attempt=1, **moments) -> Attempt:
    return Attempt(
        stage="asr", attempt=attempt, batch_size=1, items=1, outcome="ok", wall_s=1.0,
        timeline=ChildTimeline(**moments),
    )  # fmt: skip


def test_overlapping_intervals_count_once_and_gaps_are_exposed():
    # Given a run from 0 to 20 s: children computing 2-6 and 4-9 (overlapping), 12-15, and 14-14.5 inside it
    spans = [(4.0, 9.0), (2.0, 6.0), (12.0, 15.0), (14.0, 14.5)]
    # When the union is taken
    e = exposure(spans, 0.0, 20.0)
    # Then 2-9 and 12-15 are computing (10 s), the gaps 0-2, 9-12, 15-20 exposed (10 s)
    assert (e.wall_s, e.computing_s, e.exposed_s) == (20.0, 10.0, 10.0)


def test_intervals_are_clipped_to_the_run_and_empty_ones_ignored():
    e = exposure([(-5.0, 3.0), (8.0, 30.0), (5.0, 5.0), (7.0, 6.0)], 0.0, 10.0)
    assert e.computing_s == pytest.approx(5.0) and e.exposed_s == pytest.approx(5.0)
    nothing = exposure([], 100.0, 130.0)
    assert (nothing.computing_s, nothing.exposed_s) == (0.0, 30.0)
    assert exposure([(0.0, 50.0)], 10.0, 20.0).exposed_s == 0.0


def test_computing_takes_each_child_from_first_item_to_last_and_skips_those_that_never_computed():
    children = [_child(first_item=3.0, last_item=7.0), _child(spawned=1.0, exited=2.0)]
    assert computing(children) == [(3.0, 7.0)]


def test_a_stage_waits_from_ready_to_its_first_item_and_again_after_each_respawn():
    # Given the previous stage ended at 10 s; a child computed 14-20 and exited at 21 (out of memory),
    # the respawn computed from 24 to 30
    children = [
        _child(1, spawned=8.0, first_item=14.0, last_item=20.0, exited=21.0),
        _child(2, spawned=21.5, first_item=24.0, last_item=30.0, exited=31.0),
    ]
    # Then it waited 10->14 and 21->24
    assert waited(10.0, children) == pytest.approx(7.0)
    assert last_exit(children) == 31.0
    # a child that died loading is all wait; no timeline is no answer
    assert waited(10.0, [_child(spawned=10.5, exited=13.0)]) == pytest.approx(3.0)
    assert waited(10.0, [_child(1, spawned=10.5, exited=13.0), children[1]]) == pytest.approx(14.0)
    assert (
        waited(10.0, [Attempt(stage="asr", attempt=1, batch_size=1, items=1, outcome="ok", wall_s=1)]) is None
    )


def test_stage_times_sum_a_stage_over_its_chunks_and_give_seconds_per_audio_hour():
    def run(chunk, waited_s, compute_s, model_s, audio_s):
        child = Attempt(
            stage="asr", attempt=1, batch_size=1, items=1, outcome="ok", wall_s=1.0, import_s=1.0,
            load_s=2.0, compute_s=compute_s, model_s=model_s, audio_s=audio_s,
        )  # fmt: skip
        return StageRun(stage="asr", chunk=chunk, attempts=[child], waited_s=waited_s)

    (asr,) = stage_times([run(1, 3.0, 10.0, 8.0, 1800.0), run(2, 1.0, 8.0, 6.0, 1800.0), StageRun(stage="x")])
    assert (asr.waited_s, asr.import_s, asr.load_s, asr.compute_s) == (4.0, 2.0, 4.0, 18.0)
    assert (asr.model_s, asr.host_s, asr.audio_s) == (14.0, 4.0, 3600.0)
    assert asr.per_audio_hour == pytest.approx(18.0)
