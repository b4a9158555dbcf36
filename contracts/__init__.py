"""Data exchanged between the orchestrator (parent) and stages (children).

Pydantic models and their atomic, validated load/save. Imports nothing else of
this project and no model library.
"""

from contracts.artifacts import (
    SCHEMA_VERSION,
    Artifact,
    AudioArtifact,
    EmbeddingsArtifact,
    Segment,
    TranscriptArtifact,
    Word,
)
from contracts.errors import ArtifactError, InputError, PipelineError
from contracts.exit_codes import ExitCode
from contracts.io import load_artifact, load_model, save_model, sha256_file
from contracts.stage import ItemResult, StageRequest, StageResult, WorkItem

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactError",
    "AudioArtifact",
    "EmbeddingsArtifact",
    "ExitCode",
    "InputError",
    "ItemResult",
    "PipelineError",
    "Segment",
    "StageRequest",
    "StageResult",
    "TranscriptArtifact",
    "WorkItem",
    "Word",
    "load_artifact",
    "load_model",
    "save_model",
    "sha256_file",
]
