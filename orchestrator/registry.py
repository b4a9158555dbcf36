"""The stage registry: the one table of the stages this project runs.

Each :class:`StageDef` says, for one stage, what the parent needs to know
without importing its code: the module a child runs, the artifact it writes
(and under which key), the artifacts it reads, its typed settings (and how they
are built from :class:`~orchestrator.settings.Settings`), when it runs at all,
its batch size, what its models need on the GPU, and whether the fast path may
go on without it. ``process`` (``orchestrator.run.pipeline``), ``enroll``
(``orchestrator.run.enroll``), VRAM sizing (``orchestrator.gpu.sizing``) and the
GPU guard all read this table; nothing else names a stage's module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from contracts import (
    Artifact,
    AudioArtifact,
    DiarizationArtifact,
    EmbeddingsArtifact,
    SpeakerEmbeddingsArtifact,
    TranscriptArtifact,
    VoiceProfile,
    sha256_file,
)
from contracts.stage_settings import (
    AlignmentSettings,
    AsrSettings,
    AudioSettings,
    DiarizationSettings,
    EmbeddingsSettings,
    EnrollmentSettings,
    StageSettings,
    VoiceProfileSettings,
)
from contracts.units import GIB_MIB
from orchestrator.gpu.sizing import ASR_NEEDS, EMBEDDING_NEEDS, UNKNOWN, Need, model_key
from orchestrator.settings import Settings


@dataclass(frozen=True)
class StageSpec:
    """One stage as a run uses it: the registry's entry with its settings and batch size resolved."""

    name: str
    module: str
    output: type[Artifact]
    batch_size: int = 1
    settings: StageSettings = field(default_factory=StageSettings)
    #: False for scratch artifacts (decoded audio) that only feed the next stage
    keep: bool = True
    #: the artifacts (by key) this stage reads; None: the previous stage's
    inputs: tuple[str, ...] | None = None
    #: the artifact's key (file name and input key) when not its kind, e.g. "asr" for the raw transcript
    key: str | None = None
    #: inputs this stage can do without (when the fast path skipped them, or their stage is off)
    optional_inputs: tuple[str, ...] = ()
    #: the fast path may go on without this stage when it runs out of memory even at batch size 1
    skippable: bool = False
    #: the stage computes on the GPU when there is one (decoding audio does not): executors that
    #: place work (Ray) reserve a GPU for it
    gpu: bool = True
    #: the stage's code version (``StageDef.version``): part of the fingerprint
    version: int = 1
    #: the model this run will use, as ``orchestrator.models.choice`` resolved it (None: no model, or not
    #: resolved): part of the fingerprint
    model: str | None = None
    #: the stage reads each input's vocabulary files (``WorkItem.vocabulary``; part of its fingerprint)
    vocabulary: bool = False

    @cached_property  # planning asks it for every stage of every input (frozen: it never changes)
    def kind(self) -> str:
        """The output artifact's key ("audio", "asr", "transcript", ...): its file name and input key."""
        return self.key or self.output.model_fields["kind"].default


@dataclass(frozen=True)
class StageDef:
    """A registry entry (see the module doc)."""

    name: str
    module: str
    output: type[Artifact]
    settings_model: type[StageSettings]
    #: the stage's settings for a run (validated: the model has no defaults)
    build: Callable[[Settings], StageSettings]
    batch_size: Callable[[Settings], int] = lambda s: 1
    #: whether the stage is part of ``process`` for these settings
    enabled: Callable[[Settings], bool] = lambda s: True
    key: str | None = None
    inputs: tuple[str, ...] | None = None
    optional_inputs: tuple[str, ...] = ()
    skippable: Callable[[Settings], bool] = lambda s: False
    gpu: bool = True
    keep: bool = True
    #: model name (as :attr:`need_key` gives it) -> what it needs on the GPU; empty: no GPU model
    needs: Mapping[str, Need] = field(default_factory=dict)
    #: the model name in this stage's settings that :attr:`needs` is keyed by (None: no GPU model this time)
    need_key: Callable[[StageSettings], str | None] = lambda settings: None
    #: bump when a change of the stage's code changes its artifacts: every input's artifact is then redone
    version: int = 1
    #: the stage reads each input's vocabulary files
    vocabulary: bool = False

    def spec(self, settings: Settings) -> StageSpec:
        return StageSpec(
            self.name,
            self.module,
            self.output,
            batch_size=self.batch_size(settings),
            settings=self.build(settings),
            keep=self.keep,
            inputs=self.inputs,
            key=self.key,
            optional_inputs=self.optional_inputs,
            skippable=self.skippable(settings),
            gpu=self.gpu,
            version=self.version,
            vocabulary=self.vocabulary,
        )

    def need(self, settings: StageSettings) -> Need | None:
        """What this stage needs on the GPU with ``settings`` (None: no GPU model)."""
        key = self.need_key(settings) if self.needs else None
        return None if key is None else self.needs.get(key, UNKNOWN)


def profile_fingerprints(directory: Path | None) -> dict[str, str]:
    """name -> sha256 of each voice profile file in ``directory``: part of the enrollment fingerprint,
    so enrolling a new voice redoes the matching."""
    if directory is None or not Path(directory).is_dir():
        return {}
    return {path.stem: sha256_file(path) for path in sorted(Path(directory).glob("*.json"))}


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _fast_path(s: Settings) -> bool:
    return s.enable_fast_path


#: the speaker encoders' and diarizers' needs (weights + context; per item = one segment batch element)
SPEAKER_NEEDS: dict[str, Need] = {
    "campplus": Need(0.3 * GIB_MIB, 8),
    "ecapa": Need(0.5 * GIB_MIB, 16),
    "embedded": Need(0.5 * GIB_MIB, 16),
    "auto": Need(1.5 * GIB_MIB, 64),
}
ALIGNMENT_NEEDS: dict[str, Need] = {"wav2vec2": Need(1.0 * GIB_MIB, 64)}


STAGES: tuple[StageDef, ...] = (
    StageDef(
        "audio",
        "stages.audio",
        AudioArtifact,
        AudioSettings,
        build=lambda s: AudioSettings(
            on_damaged=s.on_damaged, roots=[str(r) for r in s.read_roots], channels=s.channels
        ),
        gpu=False,
        keep=False,
    ),
    StageDef(
        "asr",
        "stages.asr",
        TranscriptArtifact,
        AsrSettings,
        key="asr",
        inputs=("audio",),
        build=lambda s: AsrSettings(
            model=s.asr_model,
            language=s.asr_language,
            languages=s.asr_languages,
            multilingual=s.asr_multilingual,
            weights_dir=_str(s.weights_dir),
            identify_only=s.langid_only,
            compute_type=s.asr_compute_type,
            allow_hub=s.hub,
            pack_inputs=s.asr_pack_inputs,
            join_inputs=s.asr_join_inputs,
            compression_ratio_threshold=s.asr_compression_ratio_threshold,
            chunk_size=s.asr_chunk_size,
            word_timestamps=s.align,
            prompt=s.asr_prompt,
            hotwords=s.asr_hotwords,
            translate=s.asr_translate and not s.langid_only,
            runtime=s.asr_runtime,
        ),
        batch_size=lambda s: s.asr_batch_size,
        vocabulary=True,
        needs=ASR_NEEDS,
        need_key=lambda c: model_key(c.model),
    ),
    StageDef(
        "diarization",
        "stages.diarization",
        DiarizationArtifact,
        DiarizationSettings,
        inputs=("audio",),
        build=lambda s: DiarizationSettings(
            model=s.diarization_model,
            min_speakers=s.min_speakers,
            max_speakers=s.max_speakers,
            weights_dir=_str(s.weights_dir),
            runtime=s.diarization_runtime,
        ),
        batch_size=lambda s: s.diarization_batch_size,  # its segmentation and speaker-embedding batches
        enabled=lambda s: s.speakers and not s.langid_only,
        skippable=_fast_path,
        needs=SPEAKER_NEEDS,
        need_key=lambda c: "embedded" if c.model == "embedded" else "auto",
        version=2,
    ),  # 2: the artifact keeps each speaker's voice (corpus speakers)
    StageDef(
        "enrollment",
        "stages.enrollment",
        SpeakerEmbeddingsArtifact,
        EnrollmentSettings,
        inputs=("diarization", "audio"),
        build=lambda s: EnrollmentSettings(
            encoder=s.speaker_encoder,
            ecapa_source=s.ecapa_source,
            allow_hub=s.hub,
            weights_dir=_str(s.weights_dir),
            profiles_dir=_str(s.profiles_dir),
            profiles=profile_fingerprints(s.profiles_dir),
        ),
        batch_size=lambda s: s.voice_enrollment_batch_size,
        enabled=lambda s: (
            s.speakers
            and not s.langid_only
            and not s.skip_voice_embeddings
            and bool(profile_fingerprints(s.profiles_dir))
        ),
        skippable=_fast_path,
        needs=SPEAKER_NEEDS,
        need_key=lambda c: c.encoder,
    ),
    StageDef(
        "alignment",
        "stages.alignment",
        TranscriptArtifact,
        AlignmentSettings,
        inputs=("asr", "audio", "diarization", "speaker_embeddings"),
        optional_inputs=("diarization", "speaker_embeddings"),
        build=lambda s: AlignmentSettings(
            align=s.align,
            allow_hub=s.hub,
            speakers=s.speakers,
            skip_voice_embeddings=s.skip_voice_embeddings,
            channel_names=s.channel_names if s.channels != "mix" else [],
            asr_model=s.asr_model,
            weights_dir=_str(s.weights_dir),
        ),
        batch_size=lambda s: s.alignment_batch_size,
        enabled=lambda s: not s.langid_only,
        needs=ALIGNMENT_NEEDS,
        need_key=lambda c: "wav2vec2" if c.align else None,
    ),
    StageDef(
        "embeddings",
        "stages.embeddings",
        EmbeddingsArtifact,
        EmbeddingsSettings,
        inputs=("transcript",),
        build=lambda s: EmbeddingsSettings(
            profile=s.embedding_profile, fallback=s.embedding_fallback, allow_hub=s.hub
        ),
        enabled=lambda s: not s.langid_only,
        batch_size=lambda s: s.embedding_batch_size,
        needs=EMBEDDING_NEEDS,
        need_key=lambda c: c.profile,
    ),
)

#: ``pipeline enroll NAME CLIP...``: not part of ``process``
VOICE_PROFILE = StageDef(
    "voice_profile",
    "stages.voice_profile",
    VoiceProfile,
    VoiceProfileSettings,
    build=lambda s: VoiceProfileSettings(
        name="speaker",
        encoder=s.speaker_encoder,
        ecapa_source=s.ecapa_source,
        allow_hub=s.hub,
        weights_dir=_str(s.weights_dir),
        threshold=s.speaker_threshold,
    ),
    batch_size=lambda s: s.voice_enrollment_batch_size,
    needs=SPEAKER_NEEDS,
    need_key=lambda c: c.encoder,
)

BY_NAME: dict[str, StageDef] = {d.name: d for d in (*STAGES, VOICE_PROFILE)}


def process_specs(settings: Settings) -> list[StageSpec]:
    """The stages ``process`` runs for ``settings``, in order. A stage's declared inputs that no earlier
    stage produces (diarization off, no profiles) are left out; they must be optional."""
    specs: list[StageSpec] = []
    produced: set[str] = set()
    for definition in STAGES:
        if not definition.enabled(settings):
            continue
        spec = definition.spec(settings)
        if spec.inputs is not None:
            missing = [k for k in spec.inputs if k not in produced]
            required = [k for k in missing if k not in spec.optional_inputs]
            if required:
                raise ValueError(f"stage {spec.name} reads {required} that no earlier stage writes")
            spec = StageSpec(**{**spec.__dict__, "inputs": tuple(k for k in spec.inputs if k in produced)})
        specs.append(spec)
        produced.add(spec.kind)
    return specs


def stage_settings(stage: str, settings: Settings | None = None, **fields) -> StageSettings:
    """``stage``'s settings built from ``settings`` (default: ``Settings()``) with some of the stage's own
    fields replaced, validated (benchmarks and tests that run one stage directly). A new ``profiles_dir``
    brings its profiles' fingerprints along."""
    definition = BY_NAME[stage]
    values = definition.build(settings or Settings()).model_dump() | fields
    if "profiles_dir" in fields and "profiles" not in fields and "profiles" in values:
        values["profiles"] = profile_fingerprints(fields["profiles_dir"] and Path(fields["profiles_dir"]))
    return definition.settings_model.model_validate(values)


def gpu_need_mib(stage: str, settings: Mapping[str, object]) -> float:
    """Free GPU memory ``stage`` needs to start with a batch of one, from the settings in its request
    (0 for stages without a GPU model, or unknown stages such as the tests' fixtures)."""
    definition = BY_NAME.get(stage)
    if definition is None:
        return 0.0
    try:
        need = definition.need(definition.settings_model.model_validate(settings))
    except ValueError:
        return 0.0
    return 0.0 if need is None else need.model_mib + need.per_item_mib
