"""Admission by expected wait, the pure part: the decision and the throughput it is estimated from."""

from __future__ import annotations

from orchestrator.api.admission import Throughput, refusal


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
