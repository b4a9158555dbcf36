"""Admission by expected wait: a request that cannot finish within its deadline is refused at once (429).

The maths is pure and lives here (like ``orchestrator.run.outcome`` for retries): the embedding queues
(``orchestrator.api.workers``) and the transcription queue (``orchestrator.api.jobs``) estimate a
request's wait from the work queued ahead of it and the throughput they measured, and ask
:func:`refusal` whether to take it. A refused request's ``Retry-After`` is when the work ahead will have
shrunk enough for it to fit, so a client that honours it is not refused again for the same reason.
"""

from __future__ import annotations

import math

#: the share of the deadline an accepted request's expected wait may use: the rest absorbs estimation
#: error and the HTTP side's own time
MARGIN = 0.8


def refusal(ahead_s: float, own_s: float, deadline_s: float, margin: float = MARGIN) -> int | None:
    """None to admit a request expected to wait ``ahead_s`` for the work before it and ``own_s`` for its
    own; else the seconds after which it would fit (``Retry-After``, at least 1). An empty queue admits
    anything (a request larger than its deadline still gets its chance, alone)."""
    budget = deadline_s * margin
    if ahead_s <= 0 or ahead_s + own_s <= budget:
        return None
    return max(1, math.ceil(ahead_s + own_s - budget))


class Throughput:
    """Tokens per second a worker computes and tokens per queued text, learnt from its micro-batches
    (exponentially weighted, recent batches weigh more). ``measured`` stays False until the first batch:
    before it nothing is refused (the only bound is the queue's length)."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.tokens_per_s = 0.0
        self.tokens_per_text = 0.0
        self.batch_s = 0.0
        self.measured = False

    def observe(self, tokens: int, texts: int, seconds: float) -> None:
        if tokens <= 0 or texts <= 0 or seconds <= 0:
            return
        rate, per_text = tokens / seconds, tokens / texts
        if not self.measured:
            self.tokens_per_s, self.tokens_per_text, self.batch_s, self.measured = rate, per_text, seconds, True
            return
        w = self.weight
        self.tokens_per_s = (1 - w) * self.tokens_per_s + w * rate
        self.tokens_per_text = (1 - w) * self.tokens_per_text + w * per_text
        self.batch_s = (1 - w) * self.batch_s + w * seconds

    def seconds(self, tokens: float) -> float:
        """Seconds to compute ``tokens`` at the measured rate (0 before any measurement)."""
        return tokens / self.tokens_per_s if self.measured else 0.0

    def queue_seconds(self, texts: int) -> float:
        """Seconds to compute ``texts`` queued texts of the usual length, plus the micro-batch in flight."""
        if not self.measured or texts <= 0:
            return 0.0
        return self.seconds(texts * self.tokens_per_text) + self.batch_s
