"""Where a run's wall time went, from its children's timelines (pure functions, no I/O).

- **waited**: per stage, the seconds between the moment the run could start it (the previous stage's last
  child's exit, or the chunk's start) and its first item starting: spawn, imports and model load that no
  other work hid; a respawn's exit-to-first-item counts too.
- **exposed**: for the run, the wall seconds during which no stage child was computing (the union of every
  child's [first item started, last item finished] taken from the run's wall): start-ups, loads, waits and
  the parent's own work between stages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from contracts.report import Attempt, StageRun

#: seconds in an hour of audio
HOUR = 3600.0


@dataclass(frozen=True)
class Exposure:
    wall_s: float
    #: seconds during which at least one child was computing
    computing_s: float
    #: the rest of the wall
    exposed_s: float


def exposure(intervals: Iterable[tuple[float, float]], start: float, end: float) -> Exposure:
    """How much of ``[start, end]`` the union of ``intervals`` covers (overlaps counted once; intervals
    clipped to the window; empty or reversed ones ignored)."""
    wall = max(0.0, end - start)
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start))
    covered, reach = 0.0, start
    for a, b in clipped:
        if b <= reach:
            continue
        covered += b - max(a, reach)
        reach = b
    return Exposure(wall, covered, wall - covered)


def computing(attempts: Iterable[Attempt]) -> list[tuple[float, float]]:
    """Each child's compute interval: first item started to last item finished (children without both:
    none)."""
    spans = []
    for a in attempts:
        t = a.timeline
        if t is not None and t.first_item is not None and t.last_item is not None:
            spans.append((t.first_item, t.last_item))
    return spans


def waited(ready: float, attempts: list[Attempt]) -> float | None:
    """Seconds the run waited for a stage's children to compute, from ``ready`` (the moment it could start
    the stage): to each computing child's first item, from ``ready`` or the previous computing child's exit.
    A child that never computed (died loading) adds its whole time. None: no child has a timeline."""
    timed = [a.timeline for a in attempts if a.timeline is not None]
    if not timed:
        return None
    total, since = 0.0, ready
    for t in timed:
        if t.first_item is not None:
            total += max(0.0, t.first_item - since)
            since = t.exited if t.exited is not None else t.last_item or t.first_item
    last = timed[-1]
    if last.first_item is None and last.exited is not None:  # the last child never computed
        total += max(0.0, last.exited - since)
    return total


def last_exit(attempts: list[Attempt]) -> float | None:
    """When a stage's last child was seen to end (None: no child's exit was timed)."""
    exits = [a.timeline.exited for a in attempts if a.timeline is not None and a.timeline.exited is not None]
    return max(exits) if exits else None


@dataclass(frozen=True)
class StageTimes:
    """One stage over the run (its chunks and respawns summed), in seconds; None: not measured."""

    stage: str
    waited_s: float | None
    import_s: float | None
    load_s: float | None
    compute_s: float | None
    model_s: float | None
    host_s: float | None
    audio_s: float | None

    @property
    def per_audio_hour(self) -> float | None:
        """Compute seconds per hour of audio the stage finished."""
        if self.compute_s is None or not self.audio_s:
            return None
        return self.compute_s * HOUR / self.audio_s


def stage_times(runs: Iterable[StageRun]) -> list[StageTimes]:
    """Per stage, in the order stages first ran: the sums over its stage runs and their children."""
    grouped: dict[str, list[StageRun]] = {}
    for run in runs:
        if run.attempts:
            grouped.setdefault(run.stage, []).append(run)
    return [_times(stage, group) for stage, group in grouped.items()]


def _times(stage: str, runs: list[StageRun]) -> StageTimes:
    attempts = [a for run in runs for a in run.attempts]
    return StageTimes(
        stage=stage,
        waited_s=_sum(run.waited_s for run in runs),
        import_s=_sum(a.import_s for a in attempts),
        load_s=_sum(a.load_s for a in attempts),
        compute_s=_sum(a.compute_s for a in attempts),
        model_s=_sum(a.model_s for a in attempts),
        host_s=_sum(a.host_s for a in attempts),
        audio_s=_sum(a.audio_s for a in attempts),
    )


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None
