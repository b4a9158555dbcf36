"""Several inputs' speech in one Whisper window, and its words split back to each input (pure functions).

Whisper's encoder costs a full 30 s window whatever the speech in it, so a 6 s
clip costs what 30 s cost. The ASR stage therefore joins the speech windows of
several inputs of the same language into one window of at most ``limit_s``
seconds, with ``gap_s`` of silence between two of them, decodes it once, times
its words by cross-attention, and gives each input the words that start in its
own stretch (to the middle of the gaps), clamped inside it and shifted back to
the input's own time.

A word never crosses from one input into another: the decoder may skip an
input's speech and say the next one's words early, or run the end of one
sentence on into the gap, and cross-attention then times those words inside the
wrong stretch. :func:`doubts` names each input whose share cannot be trusted: a
word timed to start in the gap before its input's stretch or to run on to within
``MARGIN_S`` of the middle of the gap after it (both inputs of that boundary), no
word at all, or more or fewer words than its seconds of speech can hold
(``MAX_WORDS_PER_S``, ``MIN_WORDS_PER_S``; with its neighbours). The caller
decodes each of them again alone.

:class:`Joiner` decides which windows share: first fit over a few open joined
windows per language, in arrival order (what keeps an input's wait short);
a window that leaves no room for another input's speech (``min_room_s``) is
decoded alone, as it would be without joining. :func:`split_words` is the way
back. No model, no I/O: unit-tested in tests/stages/whisper/test_joining.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from contracts import Word

#: seconds of silence between two inputs' speech in a joined window (room for a last word's timing to run on)
GAP_S = 2.0
#: a word timed more than this before its input's stretch, or this close to the middle of a gap, is not
#: placed with certainty (see :func:`doubts`)
MARGIN_S = 0.25
#: an input's share of a joined window holding more words than this per second of its speech took a neighbour's
MAX_WORDS_PER_S = 5.0
#: ... and fewer than this per second beyond its first (a 4 s sentence of 3 words) lost some to a neighbour
MIN_WORDS_PER_S = 1.0
#: a joined window with less room than this left (after the gap) takes no more speech
MIN_ROOM_S = 2.0
#: joined windows per language open to more speech at once; the oldest is closed when one more is needed
OPEN_WINDOWS = 4


@dataclass(eq=False)
class Joined:
    """One decoder window: ``parts`` (opaque: the caller's input and window) of ``durations`` seconds each,
    laid out in order with ``gap_s`` between them. One part: a window decoded as it is alone."""

    key: Hashable
    gap_s: float
    parts: list = field(default_factory=list)
    durations: list[float] = field(default_factory=list)

    @property
    def offsets(self) -> list[float]:
        """Where each part starts in the joined window (seconds)."""
        out, at = [], 0.0
        for d in self.durations:
            out.append(at)
            at += d + self.gap_s
        return out

    @property
    def length(self) -> float:
        return sum(self.durations) + self.gap_s * max(0, len(self.durations) - 1)

    @property
    def spans(self) -> list[tuple[float, float]]:
        return [(o, o + d) for o, d in zip(self.offsets, self.durations)]

    def add(self, part, duration: float) -> None:
        self.parts.append(part)
        self.durations.append(duration)

    def keep(self, wanted: Callable[[object], bool]) -> None:
        """Drop the parts not ``wanted`` (e.g. of an input that failed); the others close up."""
        kept = [(p, d) for p, d in zip(self.parts, self.durations) if wanted(p)]
        self.parts = [p for p, _ in kept]
        self.durations = [d for _, d in kept]


class Joiner:
    """Packs speech windows into :class:`Joined` windows of at most ``limit_s`` seconds, per key (language).

    ``add`` returns the joined windows that are complete (full, or pushed out by a newer one), ``flush`` the
    rest. A part whose key is None, or that leaves less than ``min_room_s`` beside it, comes back alone at once.
    """

    def __init__(
        self,
        limit_s: float,
        gap_s: float = GAP_S,
        min_room_s: float = MIN_ROOM_S,
        open_windows: int = OPEN_WINDOWS,
    ):
        self.limit_s = limit_s
        self.gap_s = gap_s
        self.min_room_s = min_room_s
        self.open_windows = max(1, open_windows)
        self.open: list[Joined] = []

    def _room(self, window: Joined) -> float:
        return self.limit_s - window.length - self.gap_s

    def add(self, part, duration: float, key: Hashable | None) -> list[Joined]:
        if key is None or duration + self.gap_s + self.min_room_s > self.limit_s:
            alone = Joined(key, self.gap_s)
            alone.add(part, duration)
            return [alone]
        for window in self.open:
            if window.key == key and duration <= self._room(window) + 1e-9:
                window.add(part, duration)
                if self._room(window) < self.min_room_s:
                    self.open.remove(window)
                    return [window]
                return []
        window = Joined(key, self.gap_s)
        window.add(part, duration)
        self.open.append(window)
        same = [w for w in self.open if w.key == key]
        if len(same) > self.open_windows:
            self.open.remove(same[0])
            return [same[0]]
        return []

    def flush(self) -> list[Joined]:
        out, self.open = self.open, []
        return out

    def keep(self, wanted: Callable[[object], bool]) -> None:
        """Drop the open windows' parts not ``wanted``."""
        for window in self.open:
            window.keep(wanted)
        self.open = [w for w in self.open if w.parts]


def split_words(words: Sequence[Word], spans: Sequence[tuple[float, float]]) -> list[list[Word]]:
    """The words of a joined window (times in that window) given to its parts ``spans`` (start, end; in order,
    apart): a word goes to the part in which it starts, each part reaching to the middle of the gaps around it;
    its times are clamped inside that part and made relative to the part's start."""
    bounds = [(a_end + b_start) / 2 for (_, a_end), (b_start, _) in zip(spans, spans[1:])]
    out: list[list[Word]] = [[] for _ in spans]
    for word in words:
        start = word.start if word.start is not None else (word.end if word.end is not None else 0.0)
        k = sum(1 for b in bounds if start >= b)
        lo, hi = spans[k]
        begin = min(max(start, lo), hi)
        end = min(max(word.end if word.end is not None else begin, begin), hi)
        out[k].append(word.model_copy(update={"start": round(begin - lo, 3), "end": round(end - lo, 3)}))
    return out


def doubts(
    words: Sequence[Word],
    spans: Sequence[tuple[float, float]],
    margin_s: float = MARGIN_S,
    max_rate: float | None = MAX_WORDS_PER_S,
    min_rate: float | None = MIN_WORDS_PER_S,
) -> list[str | None]:
    """For each part ``spans`` (as :func:`split_words` takes them) of a joined window whose ``words`` are timed in
    window time: why its share of the words cannot be trusted, or None.

    A word that starts more than ``margin_s`` before its part's stretch (in the gap: it was said before) or
    ends within ``margin_s`` of the middle of the gap after it (or beyond) may belong to the other side: both
    parts are doubted. (Cross-attention stretches a sentence's last word into the silence after it, by up to
    about half a second; a word carried over to the next input reaches the middle of a 2 s gap.) A part with
    no words, or more or fewer words than its seconds of speech hold, is doubted with both its neighbours
    (its words went to or came from one of them). ``max_rate``/``min_rate`` None: no such count that way
    (languages written without spaces count characters as words)."""
    bounds = [(a_end + b_start) / 2 for (_, a_end), (b_start, _) in zip(spans, spans[1:])]
    counts = [0] * len(spans)
    out: list[str | None] = [None] * len(spans)

    def doubt(parts, reason: str) -> None:
        for j in parts:
            if 0 <= j < len(spans) and out[j] is None:
                out[j] = reason

    for word in words:
        if word.start is None or word.end is None:
            return ["a word without times"] * len(spans)
        k = sum(1 for b in bounds if word.start >= b)
        counts[k] += 1
        lo, _ = spans[k]
        said = f"{word.word.strip()!r} at {word.start:.2f}-{word.end:.2f} s"
        if k > 0 and word.start < lo - margin_s:
            doubt((k - 1, k), f"{said} starts in the gap before {lo:.2f} s")
        if k < len(bounds) and word.end > bounds[k] - margin_s:
            doubt((k, k + 1), f"{said} reaches the middle of the gap at {bounds[k]:.2f} s")
    counted: dict[int, str] = {}
    for k, ((lo, hi), count) in enumerate(zip(spans, counts)):
        seconds = hi - lo
        if count == 0:
            counted[k] = "no words"
        elif max_rate is not None and count > max_rate * seconds + 1:
            counted[k] = f"{count} words in {seconds:.1f} s"
        elif min_rate is not None and count < min_rate * (seconds - 1.0):
            counted[k] = f"only {count} word(s) in {seconds:.1f} s"
    for k, reason in counted.items():
        doubt((k,), reason)
    for k, reason in counted.items():
        doubt((k - 1, k + 1), f"beside a share with {reason}")
    return out
