"""Data exchanged between the orchestrator (parent) and stages (children).

Pydantic models and their atomic, validated load/save. Imports nothing else of
this project and no model library.
"""

from contracts.artifacts import (
    SCHEMA_VERSION,
    Artifact,
    AudioArtifact,
    DiarizationArtifact,
    EmbeddingsArtifact,
    ProfileClip,
    Provenance,
    Segment,
    SpeakerEmbeddingsArtifact,
    SpeakerMatch,
    SpeakerTurn,
    TranscriptArtifact,
    VoiceProfile,
    Word,
)
from contracts.errors import ArtifactError, DiskFullError, InputError, PipelineError
from contracts.exit_codes import ExitCode
from contracts.io import load_artifact, load_model, save_model, sha256_file
from contracts.stage import InFlight, ItemResult, SourceVersion, StageRequest, StageResult, WorkItem

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactError",
    "AudioArtifact",
    "DiarizationArtifact",
    "EmbeddingsArtifact",
    "ExitCode",
    "InFlight",
    "DiskFullError",
    "InputError",
    "ItemResult",
    "PipelineError",
    "ProfileClip",
    "Provenance",
    "Segment",
    "SpeakerEmbeddingsArtifact",
    "SpeakerMatch",
    "SpeakerTurn",
    "StageRequest",
    "StageResult",
    "TranscriptArtifact",
    "VoiceProfile",
    "SourceVersion",
    "WorkItem",
    "Word",
    "load_artifact",
    "load_model",
    "save_model",
    "sha256_file",
]
