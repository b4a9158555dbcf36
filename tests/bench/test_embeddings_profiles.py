"""The embedding-profiles bench's batching by tokens (the measurement itself is run by hand)."""

from __future__ import annotations

from bench.embeddings_profiles import texts, token_batches


def test_batches_hold_padded_tokens_within_the_budget_shortest_first():
    lengths = [30, 5, 12, 7, 30, 50, 8]
    batches = token_batches(lengths, budget=40)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) <= 40
    # 5, 7, 8 tokens pad to 3 x 8 = 24; with the 12-token text 4 x 12 = 48 > 40; a 50-token text goes alone
    assert batches == [[1, 3, 6], [2], [0], [4], [5]]


def test_texts_are_transcript_like_and_repeatable():
    first = texts(20)
    assert first == texts(20) and all(4 <= len(t.split()) <= 40 for t in first)
