"""The batching policy, the pure part: token estimates, the learnt cost of a micro-batch, the cut of the
queue's head into micro-batches."""

from __future__ import annotations

import itertools
import random

import pytest

from orchestrator.api.batching import BatchCost, estimate_tokens, head_batch, learn_chars_per_token


def test_token_estimates_round_up_add_the_special_tokens_and_stop_at_the_models_length():
    assert estimate_tokens(0, 4.0) == 2, "an empty text is its two special tokens"
    assert estimate_tokens(8, 4.0) == 4
    assert estimate_tokens(9, 4.0) == 5, "a part of a token is a token"
    assert estimate_tokens(4000, 4.0) == 1002
    assert estimate_tokens(4000, 4.0, max_tokens=256) == 256, "the worker truncates to the model's length"
    assert estimate_tokens(40, 4.0, max_tokens=256) == 12


def test_the_characters_per_token_ratio_converges_on_the_workers_counts_and_ignores_truncated_texts():
    ratio = 4.0
    for _ in range(60):  # the model's tokenizer: 3 characters per token, plus two special tokens
        ratio = learn_chars_per_token(ratio, [30, 300, 90], [12, 102, 32], max_tokens=256)
    assert ratio == pytest.approx(3.0, rel=1e-4)
    # a truncated text (its count is the model's length) says nothing about the ratio
    assert learn_chars_per_token(3.0, [10_000], [256], max_tokens=256) == 3.0
    assert learn_chars_per_token(3.0, [], []) == 3.0
    # one measurement moves the ratio a fifth of the way
    assert learn_chars_per_token(4.0, [20], [12]) == pytest.approx(0.8 * 4.0 + 0.2 * 2.0)


def test_batch_cost_learns_the_per_batch_overhead_in_tokens():
    cost = BatchCost()
    assert cost.overhead_tokens() == BatchCost.DEFAULT_OVERHEAD, "too few micro-batches seen to fit anything"
    # a GPU-like worker: 20 ms per micro-batch, plus 10 us per padded token -> overhead of 2000 tokens
    for padded in (64, 512, 2048, 8192, 300, 4000, 100, 6000, 1200, 9000):
        cost.observe(padded, 0.020 + 0.00001 * padded)
    assert cost.overhead_tokens() == pytest.approx(2000, rel=1e-6)
    # a CPU-like worker: 2 ms per batch, 1 ms per token -> 2 tokens
    cpu = BatchCost()
    for padded in (64, 512, 2048, 300, 100, 1200, 700, 90, 30, 4000):
        cpu.observe(padded, 0.002 + 0.001 * padded)
    assert cpu.overhead_tokens() == pytest.approx(2, rel=1e-6)
    # nonsense (cost falling with size) falls back to the default
    odd = BatchCost()
    for padded in range(100, 1100, 100):
        odd.observe(padded, 1.0 / padded)
    assert odd.overhead_tokens() == BatchCost.DEFAULT_OVERHEAD
    # one size only: no slope to fit
    same = BatchCost()
    for _ in range(20):
        same.observe(512, 0.1)
    assert same.overhead_tokens() == BatchCost.DEFAULT_OVERHEAD


def test_batch_cost_follows_a_worker_whose_speed_changed():
    cost = BatchCost()
    sizes = (64, 512, 2048, 300, 100, 1200, 700, 90, 30, 4000)
    for padded in sizes * 2:
        cost.observe(padded, 0.002 + 0.001 * padded)  # CPU-like first
    for padded in sizes * 30:
        cost.observe(padded, 0.020 + 0.00001 * padded)  # then moved to a GPU: recent batches weigh more
    assert cost.overhead_tokens() == pytest.approx(2000, rel=0.01)


def _cut(tokens: list[int], counts: list[int] | None = None, cap=32, budget=8192, overhead=32.0) -> list[int]:
    """head_batch over candidates named by their index (0 is the head)."""
    counts = counts or [1] * len(tokens)
    return head_batch(0, list(range(1, len(tokens))), tokens, counts, cap, budget, overhead)


def test_long_texts_travel_together_instead_of_padding_the_short_ones():
    # 28 short texts and 4 long ones, interleaved as they were queued; 32 texts and 8192 tokens fit in one
    tokens = [12] * 10 + [256] + [12] * 10 + [256, 256] + [12] * 8 + [256]
    longs = {k for k, t in enumerate(tokens) if t == 256}
    batch = _cut(tokens)
    assert batch[0] == 0 and len(batch) == 28 and not longs & set(batch), "the head's run: every short text"
    # the head long: the long texts' run
    tokens[0], tokens[10] = 256, 12
    assert sorted(_cut(tokens)) == sorted({0, 21, 22, 31})


def test_a_run_respects_the_text_cap_and_the_padded_token_budget():
    batch = _cut([50] * 20, cap=8)
    assert batch[0] == 0 and len(batch) == 8
    # 256 tokens each, 600 padded tokens at most: two texts a micro-batch
    assert len(_cut([256] * 6, budget=600)) == 2
    # counted in texts, not in queue entries: an entry of 3 texts and one of 4 under a cap of 5
    assert _cut([10, 10], counts=[3, 4], cap=5) == [0]
    assert _cut([10, 10], counts=[3, 2], cap=5) == [0, 1]


def test_a_text_beyond_the_budget_still_goes_alone():
    assert _cut([1000, 10, 10], budget=600) == [0], "the oldest text is served, whatever its length"
    assert _cut([10, 10, 10], cap=0) == [0]


def test_the_head_is_served_first_even_when_it_is_the_longest():
    # sorted: 10, 12 | 190, 195, 200 (688 tokens with the overhead; all in one: 1032)
    assert _cut([200, 10, 190, 195, 12]) == [0, 2, 3]


def test_the_overhead_decides_how_far_lengths_are_mixed():
    tokens = [10, 10, 10, 10, 100, 100, 100, 100]
    # a CPU-like overhead: separate micro-batches of 4 x 10 and 4 x 100 (2 + 440 < 1 + 800)
    assert sorted(_cut(tokens, overhead=1.0)) == [0, 1, 2, 3]
    # a GPU-like overhead: one micro-batch (1000 + 800 < 2000 + 440)
    assert sorted(_cut(tokens, overhead=1000.0)) == list(range(8))


def test_the_run_is_sorted_by_length_and_neighbours_in_length():
    tokens = [40, 300, 15, 35, 280, 45, 20, 310]
    batch = _cut(tokens, overhead=1.0)
    assert batch[0] == 0
    others = [tokens[k] for k in batch[1:]]
    assert others == sorted(others), "the head's companions in order of length"
    low, high = min(tokens[k] for k in batch), max(tokens[k] for k in batch)
    assert all(not low < tokens[k] < high for k in range(len(tokens)) if k not in batch), "no gaps"


def _best_partition_cost(tokens, counts, cap, budget, overhead):
    """Exhaustive: every cut of the sorted candidates into runs; the least cost and the runs achieving it."""
    order = sorted(range(len(tokens)), key=lambda k: tokens[k])
    best, runs_of_best = float("inf"), []
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        runs, run = [], [order[0]]
        for k, cut in zip(order[1:], cuts):
            if cut:
                runs.append(run)
                run = []
            run.append(k)
        runs.append(run)
        total = 0.0
        for r in runs:
            texts, longest = sum(counts[k] for k in r), max(tokens[k] for k in r)
            if len(r) > 1 and (texts > cap or texts * longest > budget):
                break
            total += overhead + texts * longest
        else:
            if total < best - 1e-9:
                best, runs_of_best = total, [runs]
            elif abs(total - best) <= 1e-9:
                runs_of_best.append(runs)
    return best, runs_of_best


def test_the_cut_is_one_of_least_cost_on_random_queues():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 8)
        tokens = [rng.choice([8, 12, 30, 64, 128, 256, 512]) for _ in range(n)]
        counts = [rng.randint(1, 3) for _ in range(n)]
        cap, budget, overhead = (
            rng.randint(1, 12),
            rng.choice([256, 1024, 8192]),
            rng.choice([1.0, 32.0, 2000.0]),
        )
        batch = head_batch(0, list(range(1, n)), tokens, counts, cap, budget, overhead)
        assert batch[0] == 0 and len(set(batch)) == len(batch)
        if len(batch) > 1:
            texts = sum(counts[k] for k in batch)
            assert texts <= cap and texts * max(tokens[k] for k in batch) <= budget
        _, optimal = _best_partition_cost(tokens, counts, cap, budget, overhead)
        assert any(sorted(batch) in [sorted(r) for r in runs] for runs in optimal), (
            tokens,
            counts,
            cap,
            budget,
            overhead,
            batch,
        )


def test_mismatched_sizes_are_a_programming_error():
    with pytest.raises(ValueError):
        head_batch("a", ["b"], [1], [1, 1], cap=4, budget=100, overhead=1.0)
