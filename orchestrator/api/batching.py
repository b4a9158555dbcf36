"""The embedding queue's batching policy, the pure part: token estimates, a micro-batch's cost, the cut.

No threads, processes or clocks here: :mod:`orchestrator.api.workers` holds the queue and its thread,
feeds these functions what it measured, and sends the micro-batch they choose.

- :func:`estimate_tokens` / :func:`learn_chars_per_token`: the parent never loads a tokenizer; a text's
  tokens are estimated from its length and a characters-per-token ratio learnt from the worker's exact
  counts.
- :class:`BatchCost`: seconds of a micro-batch as ``a + b x padded tokens``, fitted on the worker's
  timings; its :meth:`~BatchCost.overhead_tokens` is what one more micro-batch costs in padded tokens.
- :func:`head_batch`: the candidates sorted by estimated tokens, cut into runs of neighbours (each a
  micro-batch within the text cap and padded-token budget) of least total cost; the run holding the
  oldest text is the next micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

#: most queued texts one cut looks at (the cut is quadratic in them, under the queue's lock: ~3 ms at 256)
WINDOW_TEXTS = 256


def estimate_tokens(chars: int, chars_per_token: float, max_tokens: int | None = None) -> int:
    """Estimated tokens of a text of ``chars`` characters, special tokens included, after truncation to
    ``max_tokens`` (the model's longest sequence, when known)."""
    estimate = 2 + int(chars / chars_per_token + 0.999)
    return min(estimate, max_tokens) if max_tokens else estimate


def learn_chars_per_token(
    chars_per_token: float, lengths: Sequence[int], tokens: Sequence[int], max_tokens: int | None = None
) -> float:
    """``chars_per_token`` moved towards the ratio of texts of ``lengths`` characters that the worker
    counted ``tokens`` (two special tokens each); truncated texts (``max_tokens`` reached) say nothing."""
    chars = counted = 0
    for length, count in zip(lengths, tokens):
        if max_tokens is None or count < max_tokens:
            chars += length
            counted += max(1, count - 2)
    if counted:
        return 0.8 * chars_per_token + 0.2 * (chars / counted)
    return chars_per_token


class BatchCost:
    """Seconds of a micro-batch as ``a + b x padded tokens``, fitted (least squares, recent batches weigh
    more) on the worker's micro-batches as the parent sees them (pipe and tokenizer included).
    :meth:`overhead_tokens` (``a / b``) is what one more micro-batch costs in padded tokens: small on a
    CPU, where compute grows with every token, large on a GPU, where a batch's fixed cost dominates."""

    #: before enough micro-batches were seen (or when the fit makes no sense)
    DEFAULT_OVERHEAD = 32.0
    DECAY = 0.97

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0
        self.seen = 0

    def observe(self, padded_tokens: int, seconds: float) -> None:
        d = self.DECAY
        self.w = d * self.w + 1
        self.x = d * self.x + padded_tokens
        self.y = d * self.y + seconds
        self.xx = d * self.xx + padded_tokens * padded_tokens
        self.xy = d * self.xy + padded_tokens * seconds
        self.seen += 1

    def overhead_tokens(self) -> float:
        if self.seen < 8:
            return self.DEFAULT_OVERHEAD
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        if var <= 1e-9 * max(1.0, mx * mx):
            return self.DEFAULT_OVERHEAD
        slope = (self.xy / self.w - mx * my) / var
        if slope <= 0:
            return self.DEFAULT_OVERHEAD
        return min(4096.0, max(1.0, (my - slope * mx) / slope))


def head_batch(
    head: T,
    others: Sequence[T],
    tokens: Sequence[int],
    counts: Sequence[int],
    cap: int,
    budget: int,
    overhead: float,
) -> list[T]:
    """The micro-batch of ``head`` (first) in the cheapest cut of ``[head, *others]`` into batches.

    ``tokens[k]`` and ``counts[k]`` are the estimated tokens (of its longest text) and the texts of
    ``[head, *others][k]``. The candidates are sorted by estimated tokens and cut into runs of neighbours,
    each run a micro-batch costing ``overhead`` plus its padded tokens (texts x its longest text's
    tokens), within ``cap`` texts and ``budget`` padded tokens (a run of one may exceed them); dynamic
    programming finds the cut of least total cost, and the run holding the head is returned (the oldest
    text is always served next, the others are cut again with whatever arrives meanwhile). Long texts so
    travel together instead of padding a batch of short ones to their length."""
    units = [head, *others]
    if len(tokens) != len(units) or len(counts) != len(units):
        raise ValueError(f"{len(units)} candidates, {len(tokens)} token counts, {len(counts)} text counts")
    order = sorted(range(len(units)), key=lambda k: tokens[k])  # stable: ties keep the queue's order
    cost_of = [tokens[k] for k in order]
    texts_of = [counts[k] for k in order]
    n = len(order)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        texts = 0
        for i in range(j - 1, -1, -1):  # the run order[i:j], whose longest is order[j - 1]
            texts += texts_of[i]
            if i < j - 1 and (texts > cap or texts * cost_of[j - 1] > budget):
                break
            cost = best[i] + overhead + texts * cost_of[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    j = n
    while j:
        i = cut[j]
        run = order[i:j]
        if 0 in run:
            return [head, *(units[k] for k in run if k != 0)]
        j = i
    return [head]  # not reached: the head is in one of the runs
