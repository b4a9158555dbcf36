"""Artifacts: what one stage writes for one input and the next stage reads.

Each artifact is a JSON file; bulky arrays live in a ``.npy`` sidecar next to
it whose sha256 the artifact records. Every artifact records what really
happened (model actually used, batch size, device, fallbacks), so an output
can be explained afterwards.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: bumped whenever an artifact's meaning changes; older files are redone
SCHEMA_VERSION = 1

Sha256 = Field(pattern=r"^[0-9a-f]{64}$")


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Artifact(Strict):
    """Fields every artifact carries."""

    schema_version: Literal[1] = SCHEMA_VERSION
    #: the input (video/audio) this artifact was made for
    item_id: str = Field(min_length=1)
    #: hash of the upstream artifact and the settings that produced this one;
    #: the orchestrator reuses an artifact only when it matches
    fingerprint: str = Field(min_length=1)
    created_at: datetime = Field(default_factory=_now)


class AudioArtifact(Artifact):
    """Decoded audio: 16 kHz mono float32 samples in a ``.npy`` sidecar."""

    kind: Literal["audio"] = "audio"
    source: str
    source_size: int = Field(ge=0)
    sidecar: str = Field(pattern=r"^[^/\\]+\.npy$")
    sha256: str = Sha256
    sample_rate: Literal[16000] = 16000
    num_samples: int = Field(gt=0)
    duration_s: float = Field(gt=0)
    #: what the source held, before resampling/downmixing
    source_codec: str
    source_sample_rate: int = Field(gt=0)
    source_channels: int = Field(gt=0)

    @model_validator(mode="after")
    def _duration_matches(self) -> AudioArtifact:
        if abs(self.num_samples / self.sample_rate - self.duration_s) > 1e-3:
            raise ValueError("duration_s does not match num_samples / sample_rate")
        return self


class Word(Strict):
    word: str
    start: float | None = None
    end: float | None = None
    score: float | None = None


class Segment(Strict):
    id: int = Field(ge=0)
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    text: str
    words: list[Word] | None = None
    speaker: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Segment:
        if self.end < self.start:
            raise ValueError(f"segment {self.id} ends ({self.end}) before it starts ({self.start})")
        return self


class TranscriptArtifact(Artifact):
    kind: Literal["transcript"] = "transcript"
    source: str
    language: str
    segments: list[Segment]
    #: the model actually loaded (a path or a hub name)
    model: str
    #: what the settings asked for ("embedded", a name or a path)
    requested_model: str
    device: str
    compute_type: str
    batch_size: int = Field(ge=1)
    #: word-level alignment ran (wav2vec2); False: segment timestamps only
    aligned: bool = False
    duration_s: float = Field(ge=0)

    @model_validator(mode="after")
    def _ids(self) -> TranscriptArtifact:
        if [s.id for s in self.segments] != list(range(len(self.segments))):
            raise ValueError("segment ids must be 0..n-1 in order")
        return self


class EmbeddingsArtifact(Artifact):
    """One embedding per transcript segment, rows in segment order."""

    kind: Literal["embeddings"] = "embeddings"
    source: str
    sidecar: str = Field(pattern=r"^[^/\\]+\.npy$")
    sha256: str = Sha256
    #: the model actually used (after any fallback)
    model: str
    #: what was asked for: a profile ("speed", "quality") or a model name
    profile: str
    requested_model: str
    #: why the requested model was not used, when it was not
    fallback_reason: str | None = None
    dimension: int = Field(gt=0)
    count: int = Field(ge=0)
    normalized: bool
    device: str
    batch_size: int = Field(ge=1)
    dtype: Literal["float32"] = "float32"


ARTIFACT_TYPES: dict[str, type[Artifact]] = {
    "audio": AudioArtifact,
    "transcript": TranscriptArtifact,
    "embeddings": EmbeddingsArtifact,
}
