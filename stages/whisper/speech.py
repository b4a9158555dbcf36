"""What counts as speech: the "no hallucinated fragments" policy, as pure functions.

Whisper transcribes whatever it is given, and given a few tens of milliseconds of
audio (the tail of an utterance cut at a VAD chunk boundary) or a stretch of noise
it invents words (a classic "you"). Two guards, used by the ASR stage (pieces,
before decoding) and the alignment stage (segments, once their words are timed):

- :func:`clean_pieces`: VAD pieces too short to hold a word are merged into a
  neighbour they touch (when the merged window still fits Whisper's 30 s), else
  dropped.
- :func:`keep_segments`: a decoded segment whose (word) time lies mostly outside
  the detected speech, or that Whisper scores as likely non-speech, is dropped;
  the caller records how many.
- :func:`repeats_itself`: Whisper's guard against a decoder caught in a loop ("tell
  her, tell her, ..." over a second of audio): text whose zlib compression ratio is
  above 2.4 is decoded again (alone, then at rising temperatures).

No model, no I/O: unit-tested in tests/stages/whisper/test_speech.py.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

#: the shortest stretch of audio that can hold a word (a short "no" is ~0.15-0.2 s)
MIN_PIECE_S = 0.2
#: pieces this close (gap in seconds) are neighbours: a short one may join them
JOIN_GAP_S = 0.5
#: Whisper's window: no piece may grow past it
MAX_WINDOW_S = 30.0
#: a segment keeps less than this fraction of its time inside detected speech: dropped
MIN_SPEECH_FRACTION = 0.5
#: Whisper's own "this was not speech" rule: no-speech probability above this ...
NO_SPEECH_PROB = 0.6
#: ... together with a mean token log-probability below this
LOW_LOGPROB = -1.0
#: a segment's mean word confidence (cross-attention aligner) below this marks it non-speech too
LOW_CONFIDENCE = 0.15

Piece = tuple[float, float]


def clean_pieces(
    pieces: Sequence[Piece],
    min_s: float = MIN_PIECE_S,
    max_s: float = MAX_WINDOW_S,
    join_gap_s: float = JOIN_GAP_S,
) -> list[Piece]:
    """Pieces in time order with every piece shorter than ``min_s`` merged into a touching neighbour or dropped.

    The neighbour is the nearer of the previous and next piece within ``join_gap_s``
    whose merged span stays within ``max_s``; with none, the short piece is dropped.
    """
    items = sorted((float(s), float(e)) for s, e in pieces if e > s)
    out: list[list[float]] = []
    pending: list[float] | None = None  # a short piece waiting to be merged into the next one
    for start, end in items:
        if pending is not None:
            if start - pending[1] <= join_gap_s and end - pending[0] <= max_s:
                start = pending[0]
            pending = None
        if end - start >= min_s:
            out.append([start, end])
            continue
        prev = out[-1] if out else None
        if prev is not None and start - prev[1] <= join_gap_s and end - prev[0] <= max_s:
            prev[1] = max(prev[1], end)
        else:
            pending = [start, end]  # maybe the next piece takes it; else it is dropped
    return [(s, e) for s, e in out]


def overlap_s(start: float, end: float, pieces: Sequence[Piece]) -> float:
    """Seconds of [start, end] inside the pieces."""
    return sum(max(0.0, min(end, e) - max(start, s)) for s, e in pieces)


@dataclass(frozen=True)
class Decoded:
    """What the policy needs of a decoded segment: its time (or its words' time) and Whisper's scores."""

    start: float
    end: float
    #: the timed words' spans; None: use the segment's own span
    word_spans: tuple[Piece, ...] | None = None
    no_speech_prob: float | None = None
    avg_logprob: float | None = None
    #: mean confidence of its words (cross-attention aligner); None: unknown
    confidence: float | None = None


def is_speech(
    seg: Decoded, pieces: Sequence[Piece] | None, min_fraction: float = MIN_SPEECH_FRACTION
) -> bool:
    """False when the segment lies mostly outside detected speech or Whisper scores it as non-speech."""
    if (
        seg.no_speech_prob is not None
        and seg.no_speech_prob > NO_SPEECH_PROB
        and (seg.avg_logprob is None or seg.avg_logprob < LOW_LOGPROB)
    ):
        return False
    if seg.confidence is not None and seg.confidence < LOW_CONFIDENCE:
        return False
    if pieces is not None:
        spans = list(seg.word_spans) if seg.word_spans else [(seg.start, seg.end)]
        total = sum(max(e - s, 0.0) for s, e in spans)
        if total <= 0:  # zero-length words: their midpoints must fall in speech
            inside = sum(1 for s, e in spans if overlap_s(s - 0.01, e + 0.01, pieces) > 0)
            return inside * 2 > len(spans) if spans else False
        inside = sum(overlap_s(s, e, pieces) for s, e in spans)
        if inside < min_fraction * total:
            return False
    return True


def keep_segments(segments: Sequence[Decoded], pieces: Sequence[Piece] | None) -> tuple[list[int], int]:
    """Indices of the segments to keep (in order) and how many were dropped."""
    kept = [i for i, seg in enumerate(segments) if is_speech(seg, pieces)]
    return kept, len(segments) - len(kept)


#: Whisper's own silence rule (faster-whisper / openai-whisper defaults): a window whose no-speech
#: probability is above this and whose average log-probability is below LOGPROB_THRESHOLD is silence
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0


def whisper_says_silence(
    no_speech_prob: float | None,
    avg_logprob: float | None,
    no_speech_threshold: float = NO_SPEECH_THRESHOLD,
    logprob_threshold: float = LOGPROB_THRESHOLD,
) -> bool:
    """Whisper marked the decoded window as likely non-speech (both signals agree, as Whisper's rule asks)."""
    if no_speech_prob is None or avg_logprob is None:
        return False
    return no_speech_prob > no_speech_threshold and avg_logprob < logprob_threshold


#: Whisper's repetition guard (openai-whisper, faster-whisper and whisperX default): a decoded text whose zlib
#: compression ratio is above this is a decoder loop, not speech
COMPRESSION_RATIO_THRESHOLD = 2.4


def compression_ratio(text: str) -> float:
    """Bytes of ``text`` (UTF-8) over bytes of its zlib compression, as Whisper measures it (0 for no text)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


#: two looping decodes whose compression ratios are within this factor loop about as much: the likelier wins
SIMILAR_RATIO = 1.1


def better_loop(
    new_ratio: float, new_logprob: float | None, old_ratio: float, old_logprob: float | None
) -> bool:
    """Of two decodes of one window that both loop, whether the new one should replace the old: the one that
    loops clearly less (compression ratio lower by more than ``SIMILAR_RATIO``), else the likelier (higher
    average log-probability). Speech that really repeats itself (a chorus, a list read twice) compresses
    about as much in every decode, and then the likeliest is the best transcript; a decode caught in a
    loop can be likelier still (repetition is cheap for the decoder), so likelihood alone is not enough."""
    if new_ratio * SIMILAR_RATIO < old_ratio:
        return True
    if old_ratio * SIMILAR_RATIO < new_ratio:
        return False
    return (new_logprob if new_logprob is not None else -1e9) > (
        old_logprob if old_logprob is not None else -1e9
    )


def repeats_itself(text: str | None, threshold: float | None = COMPRESSION_RATIO_THRESHOLD) -> bool:
    """The decoder looped: ``text`` compresses better than ``threshold`` allows (None: the guard is off)."""
    return threshold is not None and bool(text) and compression_ratio(text) > threshold
