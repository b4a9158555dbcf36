"""Admission by expected wait: a request that cannot finish within its deadline is refused at once (429).

The maths is pure and lives here (like ``orchestrator.run.outcome`` for retries): the embedding queues
(``orchestrator.api.workers``) and the transcription queue (``orchestrator.api.jobs``) estimate a
request's wait from the work queued ahead of it and the throughput they measured, and ask
:func:`refusal` whether to take it. A refused request's ``Retry-After`` is when the work ahead will have
shrunk enough for it to fit, so a client that honours it is not refused again for the same reason.

Three things keep that true:

- **An empty queue is empty.** With nothing queued or in flight for a profile, a request is admitted
  whatever its size (it gets its chance alone), and nothing else counts as work ahead of it
  (:func:`work_ahead`).
- **Retry-After is the queue ahead, not more.** A refused request fits once the work ahead has shrunk
  enough, or at the latest once the queue is empty (:func:`refusal`); refused clients are spread over
  that queue's drain time (``spread``), so they do not all come back at once. A refused request is not
  work: it adds nothing to the estimate or the ``Retry-After`` of the requests after it.
- **Calibration** (:class:`Lateness`). The estimate counts the worker's compute; the server's own time
  (HTTP, JSON, the event loop shared by every connection) is not in it and grows with the number of
  connections. Each answered request's measured time is compared with its estimate, and estimates are
  scaled by that ratio (never below 1), so an accepted request still finishes within its deadline.
  Likewise the **event loop's lag** (:class:`LoopLag`): time a request spends before the server's code
  sees it (a burst of a thousand connections queues behind one event loop) is in no estimate; how late a
  periodic timer fires is, and it lengthens the work ahead of a request (when there is any).
"""

from __future__ import annotations

import math

#: the share of the deadline an accepted request's expected wait may use: the rest absorbs estimation
#: error and the HTTP side's own time
MARGIN = 0.8


def work_ahead(queue_s: float, lag_s: float) -> float:
    """Seconds of work ahead of a request arriving now: the queue's (``queue_s``: its texts and the
    micro-batch in flight) lengthened by the event loop's lag ``lag_s``. Nothing when nothing is queued or
    in flight: the lag delays work, it is none, and an empty queue stays empty however late the loop runs."""
    return queue_s + max(lag_s, 0.0) if queue_s > 0 else 0.0


def refusal(
    ahead_s: float, own_s: float, deadline_s: float, margin: float = MARGIN, spread: float = 0.0
) -> int | None:
    """None to admit a request expected to wait ``ahead_s`` for the work before it and ``own_s`` for its
    own; else the seconds after which it would be admitted (``Retry-After``, at least 1): when the work
    ahead has shrunk enough for it to fit, or, for a request larger than its budget, when the queue is
    empty; never later than ``ahead_s``. Plus ``spread`` (a share in [0, 1), drawn by the caller) of
    ``ahead_s``: refused clients come back spread over the queue's drain time, not all at once. An empty
    queue admits anything (a request larger than its deadline still gets its chance, alone)."""
    budget = deadline_s * margin
    if ahead_s <= 0 or ahead_s + own_s <= budget:
        return None
    fits_in = ahead_s - max(0.0, budget - own_s)
    return max(1, math.ceil(fits_in + spread * ahead_s))


def drain_retry(drain_s: float, floor_s: int, spread: float = 0.0) -> int:
    """``Retry-After`` for a request refused before its size is known (too many in flight, or a queue
    already past its budget): when the work queued now is expected to be done, spread like
    :func:`refusal`; never less than ``floor_s`` (``PIPELINE_RETRY_AFTER_S``)."""
    return max(floor_s, math.ceil(drain_s * (0.5 + spread)))


class LoopLag:
    """How late the event loop runs a periodic timer, which is about how long a request arriving now
    waits before the server's code sees it: the largest recent lag, fading by ``decay`` a tick."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.seconds = 0.0

    def observe(self, lag_s: float) -> None:
        self.seconds = max(max(lag_s, 0.0), self.seconds * self.decay)


class Lateness:
    """How much longer answered requests took than estimated (server time from arrival to answer over
    the queue's estimate at admission), exponentially weighted; :attr:`factor` scales later estimates.
    Requests estimated under ``MIN_ESTIMATE_S`` are not counted: their time is mostly fixed costs
    that the ratio would blow up. The factor stays within [1, ``CEILING``]."""

    MIN_ESTIMATE_S = 0.5
    CEILING = 4.0

    def __init__(self, weight: float = 0.1) -> None:
        self.weight = weight
        self.factor = 1.0

    def observe(self, estimate_s: float, actual_s: float) -> None:
        if estimate_s < self.MIN_ESTIMATE_S or actual_s <= 0:
            return
        ratio = min(self.CEILING, max(1.0, actual_s / estimate_s))
        self.factor = (1 - self.weight) * self.factor + self.weight * ratio


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
            self.tokens_per_s, self.tokens_per_text, self.batch_s, self.measured = (
                rate,
                per_text,
                seconds,
                True,
            )
            return
        w = self.weight
        self.tokens_per_s = (1 - w) * self.tokens_per_s + w * rate
        self.tokens_per_text = (1 - w) * self.tokens_per_text + w * per_text
        self.batch_s = (1 - w) * self.batch_s + w * seconds

    def seconds(self, tokens: float) -> float:
        """Seconds to compute ``tokens`` at the measured rate (0 before any measurement)."""
        return tokens / self.tokens_per_s if self.measured else 0.0

    def queue_seconds(self, texts: int, busy: bool = False) -> float:
        """Seconds to compute ``texts`` queued texts of the usual length, plus the micro-batch in flight
        (assumed when texts are queued; ``busy``: one is in flight even with none queued)."""
        if not self.measured or (texts <= 0 and not busy):
            return 0.0
        return self.seconds(texts * self.tokens_per_text) + self.batch_s
