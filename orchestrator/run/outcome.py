"""What to do after a stage child ended: the one retry policy.

How it ended (:class:`~orchestrator.process.outcome.Outcome`, read from its exit status) is a fact about
the process (``orchestrator.process.outcome``); what follows is the run's. Both functions are pure, so
they are tested without processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.process.outcome import Outcome, signal_name

OOM_ADVICE = "try a smaller model, a lighter compute type (int8 / float16), or fewer jobs sharing the GPU"


FAST_PATH = "going on without speakers (fast path; ENABLE_FAST_PATH=false makes this an error)"


@dataclass(frozen=True)
class Decision:
    #: respawn the stage for the items still to do
    retry: bool
    batch_size: int
    #: why: logged, and the error of the items when not retrying
    reason: str
    #: not retrying, but the items go on without this stage's artifact (fast path) instead of failing
    skip: bool = False
    #: seconds to wait before the retry (a refused start: the condition is expected to pass)
    wait_s: float = 0.0


def next_step(
    outcome: Outcome,
    batch_size: int,
    signal_retries: int,
    max_signal_retries: int,
    signal: int | None = None,
    stage: str = "stage",
    skippable: bool = False,
    refusals: int = 0,
    waited_s: float = 0.0,
    max_wait_s: float = 0.0,
    progressed: bool = False,
    error_retries: int = 0,
) -> Decision:
    """Decide what follows a child's exit, for the items it left unfinished.

    - out of memory: halve the batch (down to 1); at batch 1, give up with advice, or, for a
      ``skippable`` stage (diarization, enrollment with ENABLE_FAST_PATH), go on without it;
    - killed by a signal: retry with the same batch, at most ``max_signal_retries`` times;
    - refused before it started (a temporary condition, e.g. another process briefly holding the GPU's
      memory): wait with a doubling backoff (:func:`refused_wait`) while ``waited_s`` stays within
      ``max_wait_s``, then give up;
    - an error between items of a child that had finished some (``progressed``): retry the rest, at most
      ``max_signal_retries`` times (an error while items were in flight is :func:`blame`'s);
    - anything else: give up (an error before any item, e.g. loading the model, or a broken contract
      repeats).
    """
    if outcome is Outcome.OOM:
        if batch_size > 1:
            half = max(1, batch_size // 2)
            return Decision(
                True, half, f"{stage} ran out of memory at batch size {batch_size}; retrying with {half}"
            )
        if skippable:
            return Decision(
                False, 1, f"{stage} ran out of memory even at batch size 1; {FAST_PATH}", skip=True
            )
        return Decision(False, 1, f"{stage} ran out of memory even at batch size 1: {OOM_ADVICE}")
    if outcome is Outcome.KILLED:
        name = signal_name(signal) if signal else "a signal"
        if signal_retries < max_signal_retries:
            return Decision(
                True,
                batch_size,
                f"{stage} child was killed by {name}; retry {signal_retries + 1} of {max_signal_retries}",
            )
        return Decision(
            False, batch_size, f"{stage} child was killed by {name} {signal_retries + 1} times; giving up"
        )
    if outcome is Outcome.OK:
        return Decision(False, batch_size, f"{stage} finished without writing a valid artifact")
    if outcome is Outcome.INTERRUPTED:
        return Decision(False, batch_size, f"{stage} was interrupted")
    if outcome is Outcome.REFUSED:
        wait = refused_wait(refusals, waited_s, max_wait_s)
        if wait is not None:
            return Decision(
                True,
                batch_size,
                f"{stage} was not started (refusal {refusals + 1}); waiting {wait:.0f} s before trying again",
                wait_s=wait,
            )
        spent = f" (refused {refusals + 1} times over {waited_s:.0f} s)" if refusals else ""
        return Decision(False, batch_size, f"{stage} was not started{spent}")
    if outcome is Outcome.DISK_FULL:
        return Decision(False, batch_size, f"{stage} stopped: a disk it writes to is full")
    if outcome is Outcome.ERROR and progressed and error_retries < max_signal_retries:
        return Decision(
            True,
            batch_size,
            f"{stage} child failed between items; retrying the items left "
            f"({error_retries + 1} of {max_signal_retries})",
        )
    if outcome is Outcome.CONTRACT_ERROR:
        return Decision(False, batch_size, f"{stage} child rejected its request or an input artifact")
    return Decision(False, batch_size, f"{stage} child failed")


#: the first wait after a refused start, and the longest, in seconds (doubling in between)
REFUSED_FIRST_WAIT_S = 5.0
REFUSED_LONGEST_WAIT_S = 60.0


def refused_wait(refusals: int, waited_s: float, max_wait_s: float) -> float | None:
    """How long to wait before starting a refused child again: 5, 10, 20, 40, 60, 60, ... s, cut to what is
    left of ``max_wait_s``; None once ``waited_s`` has used it up."""
    left = max_wait_s - waited_s
    if left <= 0:
        return None
    return min(REFUSED_FIRST_WAIT_S * 2 ** min(refusals, 16), REFUSED_LONGEST_WAIT_S, left)


@dataclass(frozen=True)
class Blame:
    """What a child's death means for the items it was working on (see :func:`blame`)."""

    #: items that fail (or, for a skippable stage out of memory, go on without it) now, alone
    culprits: tuple[str, ...]
    #: why, for each culprit
    reason: str
    #: the batch size for the items left
    batch_size: int
    #: culprits go on without the stage (fast path) instead of failing
    skip: bool = False


def blame(
    outcome: Outcome,
    in_flight: list[str],
    crashes: dict[str, int],
    max_item_crashes: int,
    batch_size: int,
    worked_batch: int | None,
    signal: int | None = None,
    stage: str = "stage",
    hung: bool = False,
    skippable: bool = False,
    error: str | None = None,
    causes: dict[str, list[str]] | None = None,
) -> Blame | None:
    """Culprit isolation: a child that died (signal, watchdog), exited with an error or ran out of memory
    at batch size 1 while working on ``in_flight`` items suspects only those; the others go on.

    ``crashes`` (item -> deaths it was in flight at) is updated for a death; an item fails alone when it
    reaches ``max_item_crashes`` at a death where it was in flight alone. Items in flight together (a joined
    window, a shared batch) are not failed for each other: once they reach the bound, :func:`isolated` names
    them for the next child to work on apart, and the death after that names the culprit (two deaths more,
    at most, whatever a stage does). So a random kill of a child leaves the planned grouping, and its
    words, as they were. Out of memory at batch size 1 isolates at once, and the others resume at
    ``worked_batch`` (the largest batch that finished an item), not at 1. None: nobody to blame (the
    child was between items, or it is not a death): the stage-wide policy (:func:`next_step`) applies.
    ``causes`` (item -> how each death it was in flight at came, updated like ``crashes``) lets the reason
    name every different cause, in order: a random kill while a child hung on an input is said too.
    """
    if not in_flight:
        return None
    if outcome in (Outcome.KILLED, Outcome.ERROR):
        for item in in_flight:
            crashes[item] = crashes.get(item, 0) + 1
        bound = max_item_crashes if len(in_flight) == 1 else max_item_crashes + 2
        culprits = tuple(i for i in in_flight if crashes[i] >= bound)
        if outcome is Outcome.ERROR:
            how = f"exited with an error ({error})" if error else "exited with an error"
        else:
            how = (
                "hung (no progress within the watchdog's limit)"
                if hung
                else (f"was killed by {signal_name(signal)}" if signal else "was killed")
            )
        count = crashes[in_flight[0]]
        hows = [how]
        if causes is not None:
            for item in in_flight:
                causes.setdefault(item, []).append(how)
            hows = list(dict.fromkeys(causes[in_flight[0]]))
        reason = (
            f"crashed the {stage} child {count} time{'s' if count > 1 else ''}: it {', then '.join(hows)} "
            "while on this input"
        )
        return Blame(culprits, reason, batch_size)
    if outcome is Outcome.OOM and batch_size == 1:  # the same words as next_step's, for this input alone
        final = next_step(outcome, 1, 0, 0, stage=stage, skippable=skippable)
        return Blame(tuple(in_flight), final.reason, worked_batch or 1, skip=final.skip)
    return None


def isolated(crashes: dict[str, int], max_item_crashes: int, todo: list[str]) -> list[str]:
    """The items of ``todo`` the next child works on apart (:attr:`StageRequest.isolate`): those that reached
    ``max_item_crashes`` deaths in flight without being failed (they shared the work with others)."""
    return [item for item in todo if crashes.get(item, 0) >= max_item_crashes]
