"""Corpus speakers: one voice, one id across every input of an output folder (``OUT/speakers.json``).

Written and read by the parent only (``orchestrator.corpus.speakers``): the diarization artifacts keep each
input's voices; this file keeps which corpus speaker each input's speaker belongs to, the speakers'
names and centroids, and the ids ever given, so that ids stay stable across runs, merges and splits.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field, model_validator

from contracts.artifacts import Strict, require_unit

#: corpus speaker ids: S0001, S0002, ... (never reused)
SPEAKER_ID = r"^S\d{4,}$"


def speaker_id(number: int) -> str:
    return f"S{number:04d}"


def _now() -> datetime:
    return datetime.now(UTC)


class CorpusMember(Strict):
    """One input's diarized speaker, in a corpus speaker."""

    item_id: str = Field(min_length=1)
    #: the input's own label (``SPEAKER_01``)
    speaker: str = Field(min_length=1)
    #: seconds of its turns in that input
    seconds: float = Field(ge=0)
    #: the diarization artifact's fingerprint: a re-diarized input's speakers are placed again
    fingerprint: str = Field(min_length=1)
    #: the name an enrolled voice profile gave it in that input, if one did
    enrolled: str | None = None


class CorpusSpeaker(Strict):
    id: str = Field(pattern=SPEAKER_ID)
    #: given with ``pipeline speakers name`` (None: unnamed)
    name: str | None = None
    #: L2-normalised, speech-time-weighted mean of the members' voices
    centroid: list[float] = Field(min_length=1)
    members: list[CorpusMember] = Field(min_length=1)

    @property
    def seconds(self) -> float:
        return sum(m.seconds for m in self.members)

    @property
    def label(self) -> str:
        """What transcripts show: its name, else the name profiles gave most of its members, else its id."""
        if self.name:
            return self.name
        enrolled = Counter(m.enrolled for m in self.members if m.enrolled)
        return min(enrolled, key=lambda n: (-enrolled[n], n)) if enrolled else self.id


class CorpusSpeakers(Strict):
    """``OUT/speakers.json``."""

    kind: Literal["corpus_speakers"] = "corpus_speakers"
    version: Literal[1] = 1
    #: the encoder kind of every voice here ("campplus", "pyannote"); other inputs' voices are left out
    encoder: str | None = None
    #: the cosine distance under which a new voice joins a corpus speaker (the setting, when last clustered)
    distance: float = Field(ge=0, le=2)
    #: the number of the next id to give (ids are never reused, even after a merge)
    next_id: int = Field(1, ge=1)
    speakers: list[CorpusSpeaker] = Field(default_factory=list)
    #: ids merged away -> the id they were merged into
    merged: dict[str, str] = Field(default_factory=dict)
    updated_at: datetime = Field(default_factory=_now)

    @model_validator(mode="after")
    def _consistent(self) -> CorpusSpeakers:
        ids = [s.id for s in self.speakers]
        if len(ids) != len(set(ids)):
            raise ValueError("corpus speaker ids must be unique")
        if any(int(i[1:]) >= self.next_id for i in [*ids, *self.merged]):
            raise ValueError("next_id must be above every id given")
        members = [(m.item_id, m.speaker) for s in self.speakers for m in s.members]
        if len(members) != len(set(members)):
            raise ValueError("an input's speaker can be in one corpus speaker only")
        if len({len(s.centroid) for s in self.speakers}) > 1:
            raise ValueError("every centroid must have the same dimension")
        for s in self.speakers:
            require_unit(s.centroid, f"centroid of {s.id}")
        return self
