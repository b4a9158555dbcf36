"""Admission by expected wait, the pure part: the decision and the throughput it is estimated from."""

from __future__ import annotations

from orchestrator.api.admission import Lateness, LoopLag, Throughput, drain_retry, refusal, work_ahead


def test_an_empty_queue_admits_anything_and_a_full_one_refuses_with_when_it_would_fit():
    assert refusal(0.0, 500.0, 60.0) is None, "alone, a request gets its chance"
    assert refusal(10.0, 5.0, 60.0) is None
    # 40 s ahead + 10 s own > 0.8 x 60 s: refused; in 2 s the work ahead will have shrunk enough
    assert refusal(40.0, 10.0, 60.0) == 2
    assert refusal(48.0, 0.01, 60.0) == 1, "never less than a second"


def test_throughput_is_learnt_from_batches_and_unknown_until_the_first():
    rate = Throughput()
    assert rate.queue_seconds(1000) == 0.0 and rate.seconds(1000) == 0.0, "nothing measured: nothing refused"
    rate.observe(tokens=3200, texts=32, seconds=1.0)
    assert rate.seconds(6400) == 2.0
    assert rate.queue_seconds(64) == 64 * 100 / 3200 + 1.0, "the queued texts plus the micro-batch in flight"
    for _ in range(50):
        rate.observe(tokens=1600, texts=32, seconds=1.0)  # the machine got busy: half the rate
    assert abs(rate.tokens_per_s - 1600) < 1


def test_refused_clients_are_told_to_come_back_spread_over_the_queues_drain_time():
    # 40 s ahead, 10 s own, budget 48 s: fits in 2 s; the spread adds up to the 40 s queued ahead
    assert refusal(40.0, 10.0, 60.0, spread=0.0) == 2
    assert refusal(40.0, 10.0, 60.0, spread=0.5) == 22
    retries = [refusal(40.0, 10.0, 60.0, spread=u / 100) for u in range(100)]
    assert min(retries) == 2 and max(retries) == 42 and len(set(retries)) > 30, "not one moment for everyone"
    assert refusal(10.0, 5.0, 60.0, spread=0.99) is None, "the spread never refuses what fits"


def test_a_refusal_before_the_size_is_known_waits_for_the_queue_to_drain():
    assert drain_retry(0.0, 1) == 1, "nothing measured: the configured floor"
    assert drain_retry(20.0, 1, spread=0.0) == 10
    assert drain_retry(20.0, 1, spread=0.99) == 30
    assert drain_retry(0.4, 3, spread=0.99) == 3


def test_lateness_scales_estimates_by_how_late_answers_were_and_never_below_one():
    late = Lateness()
    assert late.factor == 1.0
    late.observe(estimate_s=0.1, actual_s=5.0)
    assert late.factor == 1.0, "tiny estimates are mostly fixed costs: not counted"
    for _ in range(60):
        late.observe(estimate_s=4.0, actual_s=6.0)  # the HTTP side adds half again
    assert abs(late.factor - 1.5) < 0.01
    for _ in range(60):
        late.observe(estimate_s=4.0, actual_s=1.0)  # faster than estimated: back to 1, not below
    assert abs(late.factor - 1.0) < 0.01
    for _ in range(60):
        late.observe(estimate_s=1.0, actual_s=100.0)
    assert late.factor <= Lateness.CEILING


def test_the_loop_lag_counts_only_behind_work_an_empty_queue_is_empty_however_late_the_loop():
    assert work_ahead(0.0, lag_s=0.002) == 0.0, "nothing queued or in flight: nothing ahead"
    assert work_ahead(0.0, lag_s=30.0) == 0.0
    assert work_ahead(5.0, lag_s=2.0) == 7.0, "behind queued work, the loop's lag is more of it"
    # so an idle server admits a request of any size, whatever its loop's lag
    assert refusal(work_ahead(0.0, lag_s=0.002), 2234.0, 60.0) is None


def test_retry_after_is_never_more_than_the_queue_ahead_and_refusals_do_not_add_up():
    # 10 s ahead, a request of 500 s (more than its 48 s budget): it fits once the queue is empty, in 10 s
    assert refusal(10.0, 500.0, 60.0) == 10
    assert refusal(10.0, 500.0, 60.0, spread=0.5) == 15
    # the same request refused again and again is told the same: a refusal is not work ahead of the next
    assert {refusal(40.0, 10.0, 60.0) for _ in range(100)} == {2}
    assert all(refusal(40.0, 10.0, 60.0, spread=u / 100) <= 42 for u in range(100))


def test_the_loop_lag_is_the_largest_recent_lag_fading_tick_by_tick():
    lag = LoopLag(decay=0.5)
    lag.observe(0.001)
    assert lag.seconds == 0.001
    lag.observe(4.0)  # a burst of connections held the event loop
    lag.observe(0.0)
    assert lag.seconds == 2.0, "a burst is remembered for a while, not forgotten at the next quick tick"
    for _ in range(20):
        lag.observe(0.0)
    assert lag.seconds < 1e-4
