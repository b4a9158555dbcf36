"""The one retry policy (and culprit isolation), as pure functions."""

from __future__ import annotations

import pytest

from orchestrator.process.outcome import Outcome
from orchestrator.run.outcome import blame, isolated, next_step, refused_wait


def test_oom_halves_the_batch_down_to_one():
    sizes, batch = [], 16
    while True:
        decision = next_step(Outcome.OOM, batch, 0, 2, stage="asr")
        if not decision.retry:
            break
        batch = decision.batch_size
        sizes.append(batch)
    assert sizes == [8, 4, 2, 1]
    assert "batch size 1" in decision.reason
    assert (
        "smaller model" in decision.reason and "int8" in decision.reason and "fewer jobs" in decision.reason
    )


def test_odd_batch_sizes_round_down():
    assert next_step(Outcome.OOM, 5, 0, 2).batch_size == 2
    assert next_step(Outcome.OOM, 3, 0, 2).batch_size == 1


def test_signal_kill_is_retried_a_bounded_number_of_times_with_the_same_batch():
    first = next_step(Outcome.KILLED, 8, 0, 2, signal=9, stage="asr")
    assert first.retry and first.batch_size == 8 and "SIGKILL" in first.reason
    assert next_step(Outcome.KILLED, 8, 1, 2, signal=9).retry
    last = next_step(Outcome.KILLED, 8, 2, 2, signal=9)
    assert not last.retry and "SIGKILL" in last.reason


@pytest.mark.parametrize("outcome", [Outcome.ERROR, Outcome.CONTRACT_ERROR, Outcome.INTERRUPTED, Outcome.OK])
def test_other_outcomes_are_not_retried(outcome):
    assert not next_step(outcome, 8, 0, 2).retry


def test_fast_path_skips_a_skippable_stage_only_when_it_is_out_of_memory_at_batch_1():
    """Given a skippable stage (diarization / enrollment with ENABLE_FAST_PATH), OOM still halves first;
    at batch 1 the items go on without it instead of failing. Other stages and other failures are unchanged."""
    halve = next_step(Outcome.OOM, 4, 0, 2, stage="enrollment", skippable=True)
    assert (halve.retry, halve.batch_size, halve.skip) == (True, 2, False)
    skip = next_step(Outcome.OOM, 1, 0, 2, stage="diarization", skippable=True)
    assert (skip.retry, skip.skip) == (False, True) and "without speakers" in skip.reason
    fail = next_step(Outcome.OOM, 1, 0, 2, stage="diarization", skippable=False)
    assert (fail.retry, fail.skip) == (False, False) and "smaller model" in fail.reason
    assert not next_step(Outcome.ERROR, 1, 0, 2, stage="diarization", skippable=True).skip
    assert not next_step(Outcome.KILLED, 1, 2, 2, signal=9, skippable=True).skip


# -- culprit isolation: blame() ----------------------------------------------------------------------


def test_a_death_blames_only_the_item_in_flight_and_fails_it_at_the_bound():
    crashes: dict[str, int] = {}
    first = blame(Outcome.KILLED, ["b"], crashes, 2, 4, None, signal=11, stage="asr")
    assert first.culprits == () and crashes == {"b": 1} and first.batch_size == 4
    second = blame(Outcome.KILLED, ["b"], crashes, 2, 4, None, signal=11, stage="asr")
    assert second.culprits == ("b",) and second.reason.startswith(
        "crashed the asr child 2 times: it was killed by SIGSEGV"
    )


def test_items_in_flight_together_are_not_failed_for_each_other_but_isolated_then_blamed_alone():
    """A random kill of a child working on a joined window or a shared batch fails nobody; at the bound the
    items are named for the next child to work on apart (:func:`isolated`), and the next death, alone, fails
    only the item in flight."""
    crashes: dict[str, int] = {}
    for _ in range(2):
        shared = blame(Outcome.KILLED, ["a", "b"], crashes, 2, 4, None, signal=9, stage="asr")
        assert shared.culprits == ()
    assert crashes == {"a": 2, "b": 2}
    assert isolated(crashes, 2, ["a", "b", "c"]) == ["a", "b"]
    assert isolated({"a": 1}, 2, ["a", "b"]) == []
    alone = blame(Outcome.KILLED, ["a"], crashes, 2, 4, None, signal=9, stage="asr")
    assert alone.culprits == ("a",) and "3 times" in alone.reason
    # whatever a stage does with the isolation, two deaths more in company end it
    crashes = {"x": 2, "y": 2}
    for _ in range(2):
        last = blame(Outcome.KILLED, ["x", "y"], crashes, 2, 4, None)
    assert last.culprits == ("x", "y")


def test_a_hang_is_named_as_such():
    hung = blame(Outcome.KILLED, ["x"], {}, 1, 1, None, signal=15, stage="audio", hung=True)
    assert hung.culprits == ("x",) and "hung (no progress" in hung.reason


def test_oom_blames_only_at_batch_one_and_the_rest_resume_at_the_batch_that_worked():
    assert blame(Outcome.OOM, ["b"], {}, 2, 4, 8) is None, "above 1: halve first (next_step)"
    at_one = blame(Outcome.OOM, ["b"], {}, 2, 1, 8, stage="asr")
    assert at_one.culprits == ("b",) and at_one.batch_size == 8 and "smaller model" in at_one.reason
    skip = blame(Outcome.OOM, ["b"], {}, 2, 1, None, stage="diarization", skippable=True)
    assert skip.skip and skip.batch_size == 1 and "fast path" in skip.reason


def test_nobody_in_flight_means_the_stage_wide_policy():
    assert blame(Outcome.KILLED, [], {}, 2, 4, None) is None
    assert blame(Outcome.ERROR, [], {}, 2, 4, None) is None
    assert blame(Outcome.CONTRACT_ERROR, ["a"], {}, 2, 4, None) is None


def test_an_error_exit_blames_only_the_items_in_flight_like_a_death():
    """A child that exits with an ordinary error while items are in flight fails only an
    input proven to be the culprit (in flight at ``max_item_crashes`` such exits), not its whole chunk."""
    crashes: dict[str, int] = {}
    first = blame(Outcome.ERROR, ["b"], crashes, 2, 4, None, stage="asr", error="RuntimeError: bad frame")
    assert first.culprits == () and first.batch_size == 4
    second = blame(Outcome.ERROR, ["b"], crashes, 2, 4, None, stage="asr", error="RuntimeError: bad frame")
    assert second.culprits == ("b",)
    assert second.reason == (
        "crashed the asr child 2 times: it exited with an error (RuntimeError: bad frame) while on this input"
    )


def test_an_error_between_items_retries_the_rest_a_bounded_number_of_times():
    assert next_step(Outcome.ERROR, 4, 0, 2, progressed=True, error_retries=0).retry
    assert next_step(Outcome.ERROR, 4, 0, 2, progressed=True, error_retries=1).retry
    assert not next_step(Outcome.ERROR, 4, 0, 2, progressed=True, error_retries=2).retry
    assert not next_step(Outcome.ERROR, 4, 0, 2, progressed=False).retry, "an error before any item repeats"


def test_a_refused_start_waits_with_a_doubling_bounded_backoff_then_gives_up():
    waits, waited, refusals = [], 0.0, 0
    while (
        decision := next_step(
            Outcome.REFUSED, 4, 0, 2, stage="asr", refusals=refusals, waited_s=waited, max_wait_s=300.0
        )
    ).retry:
        waits.append(decision.wait_s)
        waited += decision.wait_s
        refusals += 1
    assert waits == [5, 10, 20, 40, 60, 60, 60, 45]
    assert decision.reason == "asr was not started (refused 9 times over 300 s)"
    assert not next_step(Outcome.REFUSED, 4, 0, 2).retry, "no wait allowed: fail at once"
    assert refused_wait(0, 0.0, 2.0) == 2.0 and refused_wait(1, 2.0, 2.0) is None


def test_a_full_disk_is_its_own_outcome_and_never_retried():
    assert not next_step(Outcome.DISK_FULL, 4, 0, 2, progressed=True).retry


def test_the_reason_names_every_cause_of_an_items_deaths_in_order():
    crashes: dict[str, int] = {}
    causes: dict[str, list[str]] = {}
    blame(Outcome.KILLED, ["h"], crashes, 2, 4, None, stage="asr", hung=True, causes=causes)
    final = blame(Outcome.KILLED, ["h"], crashes, 2, 4, None, signal=9, stage="asr", causes=causes)
    assert final.culprits == ("h",)
    assert final.reason == (
        "crashed the asr child 2 times: it hung (no progress within the watchdog's limit), then was killed "
        "by SIGKILL while on this input"
    )
    again = blame(Outcome.KILLED, ["h"], crashes, 2, 4, None, signal=9, stage="asr", causes=causes)
    assert again.reason.count("SIGKILL") == 1  # each cause once
