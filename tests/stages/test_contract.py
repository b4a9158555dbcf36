"""Every stage module exposes the same entry and declares its artifact types."""

from __future__ import annotations

import inspect
from importlib import import_module

import pytest

from contracts import (
    Artifact,
    AudioArtifact,
    DiarizationArtifact,
    EmbeddingsArtifact,
    SpeakerEmbeddingsArtifact,
    StageRequest,
    StageResult,
    TranscriptArtifact,
    VoiceProfile,
)
from orchestrator import Orchestrator, Settings
from stages.runtime.base import Stage

STAGE_MODULES = {
    "audio": "stages.audio",
    "asr": "stages.asr",
    "diarization": "stages.diarization",
    "enrollment": "stages.enrollment",
    "alignment": "stages.alignment",
    "embeddings": "stages.embeddings",
    "voice_profile": "stages.voice_profile",
}


@pytest.mark.parametrize(("name", "module"), STAGE_MODULES.items())
def test_stage_module_exposes_one_stage_with_declared_types(name, module):
    stage = import_module(module).STAGE
    assert isinstance(stage, Stage) and stage.name == name
    assert issubclass(stage.output, Artifact)
    assert stage.input is None or issubclass(stage.input, Artifact)
    signature = inspect.signature(type(stage).run)
    assert list(signature.parameters) == ["self", "request", "on_item", "imported_ahead"]
    assert type(stage).run is Stage.run, "stages share the one item loop"
    annotations = inspect.get_annotations(Stage.run, eval_str=True)
    assert (annotations["request"], annotations["return"]) == (StageRequest, StageResult)


def test_pipeline_chains_outputs_to_inputs(tmp_path):
    """Given a profile to match, every stage runs; each reads its main input from an earlier stage's output."""
    (tmp_path / "Host.json").write_text("{}")
    specs = Orchestrator(Settings(profiles_dir=tmp_path)).stage_specs()
    assert [s.name for s in specs] == ["audio", "asr", "diarization", "enrollment", "alignment", "embeddings"]
    stages = [import_module(s.module).STAGE for s in specs]
    assert (
        [s.output for s in specs]
        == [st.output for st in stages]
        == [
            AudioArtifact,
            TranscriptArtifact,
            DiarizationArtifact,
            SpeakerEmbeddingsArtifact,
            TranscriptArtifact,
            EmbeddingsArtifact,
        ]
    )
    produced = {}
    for index, (spec, stage) in enumerate(zip(specs, stages)):
        keys = spec.inputs if spec.inputs is not None else ((specs[index - 1].kind,) if index else ())
        assert all(key in produced for key in keys), f"{spec.name} reads an artifact no earlier stage writes"
        if index:
            assert stage.input_key in keys and produced[stage.input_key] is stage.input
        produced[spec.kind] = spec.output
    assert len(produced) == len(specs), "every artifact has its own key (file name)"


def test_speaker_stages_follow_the_settings(tmp_path):
    def names(**kw):
        return [s.name for s in Orchestrator(Settings(**kw)).stage_specs()]

    assert names(speakers=False) == ["audio", "asr", "alignment", "embeddings"]
    assert names() == ["audio", "asr", "diarization", "alignment", "embeddings"], (
        "no profiles: nothing to match"
    )
    (tmp_path / "Host.json").write_text("{}")
    assert "enrollment" in names(profiles_dir=tmp_path)
    assert "enrollment" not in names(profiles_dir=tmp_path, skip_voice_embeddings=True)
    specs = {s.name: s for s in Orchestrator(Settings(profiles_dir=tmp_path)).stage_specs()}
    assert specs["diarization"].skippable and specs["enrollment"].skippable and not specs["asr"].skippable
    assert not Orchestrator(Settings(enable_fast_path=False)).stage_specs()[2].skippable
    # words are timed by the alignment stage, so ASR keeps whisperX's full 30 s windows with speakers on
    assert specs["enrollment"].batch_size == 4 and specs["asr"].settings.chunk_size == 30
    assert specs["alignment"].batch_size == 8


def test_voice_profile_stage_writes_profiles():
    assert import_module("stages.voice_profile").STAGE.output is VoiceProfile


def test_a_subclass_overriding_process_of_a_packing_stage_is_run_item_by_item():
    from stages.asr import AsrStage
    from stages.diarization import DiarizationStage

    class OneByOne(DiarizationStage):
        def process(self, item, audio, request):
            raise NotImplementedError

    assert AsrStage()._packs() and DiarizationStage()._packs()
    assert not OneByOne()._packs()
