"""Who the written files say is speaking: corpus speakers' labels and overlapping voices (pure functions).

A transcript artifact's segments carry the input's own labels (``SPEAKER_01``) or the names voice
profiles gave. The files written from it (``orchestrator.corpus.outputs``) show, for each of the input's
speakers, its corpus speaker's label (``orchestrator.corpus.speakers``: a name, else ``S0007``), and where
the diarization has another voice at the same time, that voice too: words and segments carry
``overlap`` (segments.jsonl, the JSON export). Captions name only the words' own speaker: the overlap is
the diarization's, not the transcript's (transcript.json and the API's verbose_json have none).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from contracts import ArtifactError, SpeakerTurn, TranscriptArtifact, load_model
from contracts.corpus import CorpusSpeakers
from orchestrator import layout

#: another voice overlaps a word (or a segment without timed words) when its turns cover this share of it
OVERLAP_SHARE = 0.5
#: a separated channel's words this close together make one turn of its speaker (:func:`channel_turns`)
TURN_GAP_S = 0.5


class Turn(NamedTuple):
    """Who speaks when, as the overlap functions read it (a :class:`~contracts.SpeakerTurn` reads alike)."""

    start: float
    end: float
    speaker: str


def channel_turns(transcript: TranscriptArtifact) -> list[Turn] | None:
    """The turns of a transcript whose channels were separated (None: they were not): each channel's
    speaker speaks from a word's start to its end, words less than ``TURN_GAP_S`` apart joined (a segment
    without timed words: its span). Speech at the same time on two channels overlaps in these turns as two
    voices do in the diarization's."""
    if not any(seg.channel is not None for seg in transcript.segments):
        return None
    spans: dict[str, list[tuple[float, float]]] = {}
    for seg in transcript.segments:
        timed = [w for w in seg.words or [] if w.start is not None and w.end is not None]
        pieces = [(w.speaker or seg.speaker, w.start, w.end) for w in timed] or [
            (seg.speaker, seg.start, seg.end)
        ]
        for speaker, start, end in pieces:
            if speaker is not None and end > start:
                spans.setdefault(speaker, []).append((start, end))
    turns = []
    for speaker, found in spans.items():
        found.sort()
        start, end = found[0]
        for a, b in found[1:]:
            if a - end <= TURN_GAP_S:
                end = max(end, b)
                continue
            turns.append(Turn(start, end, speaker))
            start, end = a, b
        turns.append(Turn(start, end, speaker))
    return sorted(turns)


def overlap_spans(turns: list[SpeakerTurn]) -> list[tuple[float, float]]:
    """The times at which two or more speakers' turns are active at once, merged, in order."""
    events = sorted(
        [(t.start, 1, t.speaker) for t in turns] + [(t.end, -1, t.speaker) for t in turns],
        key=lambda e: (e[0], e[1]),
    )
    active: dict[str, int] = {}
    spans: list[tuple[float, float]] = []
    since = None
    for time, step, speaker in events:
        active[speaker] = active.get(speaker, 0) + step
        if active[speaker] == 0:
            del active[speaker]
        if len(active) >= 2 and since is None:
            since = time
        elif len(active) < 2 and since is not None:
            if time > since:
                if spans and spans[-1][1] >= since:
                    spans[-1] = (spans[-1][0], time)
                else:
                    spans.append((since, time))
            since = None
    return spans


def overlap_seconds(turns: list[SpeakerTurn]) -> float:
    return round(sum(end - start for start, end in overlap_spans(turns)), 3)


class _Turns:
    """Turns by start time, to find the voices active during a span quickly."""

    def __init__(self, turns: list[SpeakerTurn]) -> None:
        self.turns = sorted(turns, key=lambda t: t.start)
        self.starts = [t.start for t in self.turns]
        self.longest = max((t.end - t.start for t in self.turns), default=0.0)
        self.labels = {t.speaker for t in self.turns}

    def others(self, start: float, end: float, speaker: str | None) -> list[str]:
        """Speakers other than ``speaker`` whose turns cover OVERLAP_SHARE of [start, end]."""
        if end <= start:
            return []
        covered: dict[str, float] = {}
        first = bisect.bisect_left(self.starts, start - self.longest)
        for turn in self.turns[first : bisect.bisect_right(self.starts, end)]:
            if turn.speaker == speaker:
                continue
            share = min(end, turn.end) - max(start, turn.start)
            if share > 0:
                covered[turn.speaker] = covered.get(turn.speaker, 0.0) + share
        # a name the diarization does not know: its voice is the main one
        if speaker not in self.labels and covered:
            covered.pop(max(sorted(covered), key=lambda s: covered[s]))
        return sorted(s for s, c in covered.items() if c >= OVERLAP_SHARE * (end - start))


@dataclass
class Labelled:
    """A transcript as the files show it, and each segment's own and corpus labels."""

    transcript: TranscriptArtifact
    #: per segment: the input's own label (``SPEAKER_01``), and its corpus speaker's id (None: none)
    file_speakers: list[str | None]
    corpus_speakers: list[str | None]


def label_transcript(
    transcript: TranscriptArtifact,
    turns: list[SpeakerTurn] | None,
    names: dict[str, str],
    corpus: dict[str, tuple[str, str]],
) -> Labelled:
    """``transcript`` with each speaker shown as its corpus speaker (``corpus``: own label -> (id, label)),
    else its enrolled name (``names``: own label -> name), else its own label; and each word and segment
    with the other voices the diarization ``turns`` have during it."""
    own = {name: label for label, name in names.items()}

    def file_label(speaker: str | None) -> str | None:
        return None if speaker is None else own.get(speaker, speaker)

    def show(label: str | None) -> str | None:
        if label is None:
            return None
        return corpus[label][1] if label in corpus else names.get(label, label)

    index = _Turns(turns) if turns else None
    segments, file_speakers, corpus_ids = [], [], []
    for seg in transcript.segments:
        label = file_label(seg.speaker)
        words = None
        heard: list[str] = []
        if seg.words is not None:
            words = []
            for w in seg.words:
                wl = file_label(w.speaker) or label
                others = (
                    index.others(w.start, w.end, wl)
                    if index and w.start is not None and w.end is not None
                    else []
                )
                heard += [o for o in others if o not in heard]
                words.append(
                    w.model_copy(
                        update={
                            "speaker": show(file_label(w.speaker)),
                            "overlap": [show(o) for o in others] or None,
                        }
                    )
                )
        if index and not any(w.start is not None for w in seg.words or []):
            heard = index.others(seg.start, seg.end, label)
        segments.append(
            seg.model_copy(
                update={
                    "speaker": show(label),
                    "words": words,
                    "overlap": [show(o) for o in heard if o != label] or None,
                }
            )
        )
        file_speakers.append(label)
        corpus_ids.append(corpus[label][0] if label in corpus else None)
    return Labelled(transcript.model_copy(update={"segments": segments}), file_speakers, corpus_ids)


def read_corpus(out: Path) -> CorpusSpeakers | None:
    """The output folder's corpus speakers (None: it has none): its catalogue's store
    (:class:`~orchestrator.books.speakers.SpeakerStore`), else ``OUT/speakers.json`` made by an earlier
    version, validated. An unreadable one is an error that says what to do: the corpus step never
    overwrites what it cannot read."""
    from orchestrator.books.speakers import SpeakerStore

    store = SpeakerStore(out)
    try:
        if store.exists():
            return store.load()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ArtifactError(
            store.path,
            f"its corpus speakers cannot be read ({' '.join(str(exc).split())[:200]}); restore "
            f"{layout.SPEAKERS} from a backup and move {layout.CATALOGUE} away, or run `pipeline speakers "
            f"cluster {out}` to cluster the corpus again",
        ) from None
    path = layout.path(out, layout.SPEAKERS)
    if not path.exists():
        return None
    try:
        return load_model(path, CorpusSpeakers)
    except ArtifactError as exc:
        raise ArtifactError(
            path,
            f"{exc.reason}; fix it, or move it away and run `pipeline speakers cluster "
            f"{out}` to cluster the corpus again (names and merges made so far are then "
            "lost)",
        ) from None


def corpus_labels(corpus: CorpusSpeakers | None) -> dict[str, dict[str, tuple[str, str]]]:
    """input id -> its own speaker label -> (corpus speaker id, what the files show for it)."""
    labels: dict[str, dict[str, tuple[str, str]]] = {}
    for speaker in corpus.speakers if corpus else []:
        shown = speaker.label
        for member in speaker.members:
            labels.setdefault(member.item_id, {})[member.speaker] = (speaker.id, shown)
    return labels
