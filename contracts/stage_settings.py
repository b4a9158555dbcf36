"""What each stage child may read of the run's settings: one typed model per stage.

The parent builds them from ``orchestrator.settings.Settings`` in one place (the
stage registry, ``orchestrator.registry``), validates them there, and sends their
dump in ``StageRequest.settings``; the child validates the dump again against its
stage's model (``Stage.settings_model``) before it reads anything. Fields have no
defaults on purpose: a setting is either sent or it does not exist, so the parent
and the children cannot drift apart (``tests/contracts/test_stage_settings.py``).

``MemorySettings`` is the one exception: the same memory checkpoint options reach
every stage, and their defaults are declared here once (``Settings`` reads them).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the environment variable through which every stage child learns the run's heap policy, set before
#: it imports anything heavy (``Settings.child_heap``; ``stages.runtime.memory.configure_heap`` applies it)
HEAP_ENV = "PIPELINE_CHILD_HEAP"
#: ``keep``: one malloc arena that never gives freed memory back to the kernel (the child's exit does);
#: ``system``: the C library's defaults
HeapPolicy = Literal["keep", "system"]


#: cosine similarity at which a speaker matches a profile, per encoder. CAM++ on the committed espeak
#: fixtures: same voice 0.74-0.91, different voices 0.20-0.53; ECAPA's usual verification threshold is ~0.25
#: (cosine) on VoxCeleb, but identification wants fewer false names, hence 0.5.
DEFAULT_THRESHOLDS: dict[str, float] = {"campplus": 0.6, "ecapa": 0.5}


class StageSettings(BaseModel):
    """Base of every stage's settings: frozen, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: fields that say where or how to reach things, not what the output is: left out of the fingerprint
    #: (whether the hub answers, cache and weights paths; the model that actually runs is fingerprinted
    #: on its own, see ``orchestrator.models.choice``)
    ENVIRONMENT: ClassVar[frozenset[str]] = frozenset({"allow_hub", "weights_dir", "profiles_dir", "roots"})

    def identity(self) -> dict[str, Any]:
        """The settings that change results (what the fingerprint hashes)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in self.ENVIRONMENT}


class AudioSettings(StageSettings):
    #: a source damaged part-way: keep what decoded (the input is reported ``partial``) or fail it
    on_damaged: Literal["keep", "fail"]
    #: directories the stage may read sources from, checked on the file it actually opened (the HTTP API's
    #: input roots; a job's upload folder); empty: any file
    roots: list[str] = Field(default_factory=list)
    #: the source's channels: "mix" to mono, "separate" (each channel with sound its own track), or "auto"
    #: (separate when they hold different speech; ``stages.audio.decide_channels``)
    channels: Literal["mix", "separate", "auto"] = "mix"

    def identity(self) -> dict[str, Any]:
        """As the base's, without ``channels`` when it is "mix" (what the stage did before the setting
        existed: earlier runs' fingerprints stay current)."""
        out = super().identity()
        if out.get("channels") == "mix":
            del out["channels"]
        return out


class AsrSettings(StageSettings):
    #: "embedded", a CTranslate2 directory or a model name ("auto" is resolved by the parent)
    model: str
    #: spoken language; None: English for ".en" models, detected otherwise
    language: str | None
    #: languages detection may choose from (``--languages en,de``); empty: any
    languages: list[str] = Field(default_factory=list)
    #: an input not clearly of one language has each speech region identified and decoded in its own
    #: language (stages/whisper/language.py); False: one language per input
    multilingual: bool = True
    #: where "whisper-base" (the embedded multilingual model) lives; None: .cache/weights
    weights_dir: str | None = None
    #: ``pipeline langid``: identify the language only, no transcription (segments stay empty)
    identify_only: bool = False
    #: CTranslate2 compute type; "auto": float16 on CUDA, int8 on CPU
    compute_type: str
    allow_hub: bool
    #: most seconds of speech whisperX joins into one segment
    chunk_size: int = Field(ge=1, le=30)
    #: windows of several inputs share batches (False: each input's windows alone, as whisperX does;
    #: "auto": on CUDA, and wherever windows are joined)
    pack_inputs: bool | Literal["auto"]
    #: short speech windows of several inputs of one language share one Whisper window (stages/whisper/joining.py)
    join_inputs: bool = True
    #: Whisper's ``initial_prompt``: text that sets the vocabulary and style of the first window (None: none)
    prompt: str | None = None
    #: names and terms for every input of the run, after the prompt and before each input's vocabulary files
    #: (faster-whisper's ``hotwords``: words in the text before every window)
    hotwords: list[str] = Field(default_factory=list)
    #: every input whose language is not English is also decoded with Whisper's translate task (English text,
    #: the transcript's ``translation``); needs a multilingual model
    translate: bool = False
    #: time each window's words with the decoder's cross-attention as it is decoded (the alignment stage
    #: then runs no model unless a wav2vec2 aligner is on disk); off when alignment is off
    word_timestamps: bool = True
    #: Whisper's repetition guard (stages/whisper/speech.py): a window's text compressing better than this is a
    #: decoder loop, decoded again; None: off
    compression_ratio_threshold: float | None
    #: what runs Whisper: "ctranslate2", "torch" (transformers) or "auto" (resolved in the child, which can see
    #: whether CTranslate2 can use the device)
    runtime: Literal["auto", "ctranslate2", "torch"] = "auto"

    def identity(self) -> dict[str, Any]:
        """As the base's, without ``multilingual`` when it is on: a file of one language is transcribed as
        it was before the setting existed, so earlier runs' transcripts stay current (one known to mix
        languages is redone with ``--force``)."""
        out = super().identity()
        if out.get("multilingual") is True:
            del out["multilingual"]
        return out


class DiarizationSettings(StageSettings):
    #: "auto", "embedded", or a pyannote pipeline name / local config path
    model: str
    min_speakers: int | None = Field(ge=1)
    max_speakers: int | None = Field(ge=1)
    # (no allow_hub: the pyannote pipeline reaches the hub or not through the child's HF_HUB_OFFLINE)
    #: the embedded speaker weights (None: the project's .cache/weights)
    weights_dir: str | None
    #: what runs the embedded diarizer's two models: "onnx" (ONNX Runtime, exported from the same weights at
    #: first use and checked against torch; torch where that fails) or "torch" (the earlier path)
    runtime: Literal["onnx", "torch"] = "onnx"

    #: the runtime gives the same turns (checked on export; tests/stages/test_diarization.py): a change of it
    #: reuses the artifacts instead of diarizing again
    ENVIRONMENT: ClassVar[frozenset[str]] = StageSettings.ENVIRONMENT | {"runtime"}


class EncoderSettings(StageSettings):
    """The speaker encoder, shared by enrollment and ``pipeline enroll``."""

    encoder: Literal["campplus", "ecapa"]
    ecapa_source: str
    allow_hub: bool
    weights_dir: str | None


class EnrollmentSettings(EncoderSettings):
    profiles_dir: str | None
    #: profile name -> sha256 of its file: a new enrollment changes the fingerprint, so matching is redone
    profiles: dict[str, str]


class VoiceProfileSettings(EncoderSettings):
    #: the profile's name (``pipeline enroll NAME``)
    name: str = Field(min_length=1)
    #: similarity written into the profile; None: the encoder's default
    threshold: float | None = Field(ge=-1, le=1)


class AlignmentSettings(StageSettings):
    #: the ASR model's setting, to load it again for a second pass of cross-attention alignment (already in
    #: the fingerprint through the ASR stage's)
    ENVIRONMENT: ClassVar[frozenset[str]] = StageSettings.ENVIRONMENT | {"asr_model"}

    #: word alignment with the wav2vec2 aligner when its model is available
    align: bool
    allow_hub: bool
    #: the ASR stage's ``model`` setting (None: the transcript's own ``model``)
    asr_model: str | None = None
    #: where "whisper-base" lives; None: .cache/weights
    weights_dir: str | None = None
    #: speakers are on (diarization ran or was skipped by the fast path)
    speakers: bool
    skip_voice_embeddings: bool
    #: the speaker name of each separated channel, in channel order ("channel N" past the list's end);
    #: sent empty when channels are mixed, so a name change redoes nothing there
    channel_names: list[str] = Field(default_factory=list)

    def identity(self) -> dict[str, Any]:
        """As the base's, without ``channel_names`` when it is empty (earlier runs' fingerprints stay)."""
        out = super().identity()
        if not out.get("channel_names"):
            out.pop("channel_names", None)
        return out


class EmbeddingsSettings(StageSettings):
    #: "speed", "quality", "embedded" or a model name
    profile: str
    fallback: bool
    allow_hub: bool


class MemorySettings(StageSettings):
    """Memory checkpoints inside every child (the seeds' thresholds)."""

    #: allocated % of total VRAM above which a NOTICE is logged
    notice_pct: float = Field(70.0, gt=0, le=100)
    #: ... and a WARNING
    warning_pct: float = Field(85.0, gt=0, le=100)
    #: also a checkpoint after every item
    every_item: bool = False
    #: allow TF32 matmuls / cuDNN on GPUs that have it (compute capability >= 8.0)
    tf32: bool = True
    #: most of its GPU's memory the child's torch allocator may take, as a fraction of the card
    #: (``torch.cuda.set_per_process_memory_fraction``, applied before the model loads); beyond it an
    #: allocation fails as out of memory. None: no cap. Ignored (logged) by a child that runs on the CPU
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _warning_above_notice(self) -> MemorySettings:
        if self.warning_pct < self.notice_pct:
            raise ValueError(
                f"warning_pct ({self.warning_pct}) must not be below notice_pct ({self.notice_pct})"
            )
        return self
