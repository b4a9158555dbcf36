"""The stage registry is the one table of stages: process, enroll and GPU sizing all read it."""

from __future__ import annotations

from importlib import import_module

import pytest

from contracts.stage_settings import AsrSettings
from orchestrator import Orchestrator, Settings
from orchestrator.gpu.sizing import ASR_NEEDS
from orchestrator.registry import BY_NAME, STAGES, gpu_need_mib, process_specs


@pytest.mark.parametrize("definition", list(BY_NAME.values()), ids=list(BY_NAME))
def test_every_registered_stage_module_declares_the_same_name_output_and_settings(definition):
    # Given a registry entry, When its module is imported (as a child would), Then its STAGE agrees with the table
    stage = import_module(definition.module).STAGE
    assert stage.name == definition.name
    assert stage.output is definition.output
    assert stage.settings_model is definition.settings_model


def test_process_runs_the_registry_in_order_and_only_the_enabled_stages(tmp_path):
    (tmp_path / "Host.json").write_text("{}")
    everything = [s.name for s in Orchestrator(Settings(profiles_dir=tmp_path)).stage_specs()]
    assert everything == [d.name for d in STAGES]
    assert [s.name for s in process_specs(Settings(speakers=False))] == [
        "audio",
        "asr",
        "alignment",
        "embeddings",
    ]
    assert [s.name for s in process_specs(Settings())] == [
        "audio",
        "asr",
        "diarization",
        "alignment",
        "embeddings",
    ]


def test_alignment_reads_only_the_speaker_artifacts_of_stages_that_run(tmp_path):
    (tmp_path / "Host.json").write_text("{}")

    def inputs(**kw):
        return {s.name: s.inputs for s in process_specs(Settings(**kw))}["alignment"]

    assert inputs(speakers=False) == ("asr", "audio")
    assert inputs() == ("asr", "audio", "diarization")
    assert inputs(profiles_dir=tmp_path) == ("asr", "audio", "diarization", "speaker_embeddings")


def test_gpu_needs_follow_the_request_settings_for_every_model_stage():
    def dump(name, **kw):
        return BY_NAME[name].build(Settings(**kw)).model_dump(mode="json")

    assert gpu_need_mib("audio", dump("audio")) == 0
    assert gpu_need_mib("asr", dump("asr", asr_model="large-v3")) == ASR_NEEDS["large-v3"].model_mib + 160
    assert gpu_need_mib("asr", dump("asr", asr_model="/models/large-v3/")) == gpu_need_mib(
        "asr", dump("asr", asr_model="large-v3")
    )
    assert gpu_need_mib("embeddings", dump("embeddings", embedding_profile="quality")) > gpu_need_mib(
        "embeddings", dump("embeddings", embedding_profile="speed")
    )
    # the speaker stages and alignment are sized too, so the free-memory refusal applies to them
    for name in ("diarization", "enrollment", "alignment", "voice_profile"):
        assert gpu_need_mib(name, dump(name)) > 0, name
    assert gpu_need_mib("alignment", dump("alignment", align=False)) == 0


def test_settings_that_do_not_validate_are_refused_in_the_parent():
    with pytest.raises(ValueError):
        AsrSettings(model="embedded", language=None, compute_type="int8", allow_hub=False, chunk_size=31)
    # no defaults: a setting the builder forgot is an error, not a silent default
    with pytest.raises(ValueError):
        AsrSettings(model="embedded", language=None, compute_type="int8", allow_hub=False)


def test_asr_runtime_reaches_the_asr_child_and_its_fingerprint(monkeypatch):
    def asr_settings() -> AsrSettings:
        spec = next(s for s in Orchestrator(Settings()).stage_specs() if s.name == "asr")
        # what the runner sends the child (StageRequest.settings), read as the child reads it
        return AsrSettings.model_validate(spec.settings.model_dump(mode="json"))

    # Given ASR_RUNTIME=torch in the environment, When a run builds its stages, Then the ASR child is told
    monkeypatch.setenv("ASR_RUNTIME", "torch")
    torch = asr_settings()
    assert torch.runtime == "torch"
    monkeypatch.delenv("ASR_RUNTIME")
    auto = asr_settings()
    assert auto.runtime == "auto"
    # and the runtime is part of what the artifacts are fingerprinted by: switching it transcribes again
    assert torch.identity() != auto.identity() and torch.identity()["runtime"] == "torch"


def test_asr_multilingual_reaches_the_asr_child_and_its_fingerprint(monkeypatch):
    def asr_settings() -> AsrSettings:
        spec = next(s for s in Orchestrator(Settings()).stage_specs() if s.name == "asr")
        return AsrSettings.model_validate(spec.settings.model_dump(mode="json"))

    # per-region languages are on by default; ASR_MULTILINGUAL=false keeps one language per input
    on = asr_settings()
    monkeypatch.setenv("ASR_MULTILINGUAL", "false")
    off = asr_settings()
    assert on.multilingual is True and off.multilingual is False
    # and it changes the transcripts: switching it off transcribes again; on (the default) leaves the
    # fingerprint as it was before the setting existed, so earlier runs' transcripts stay current
    assert on.identity() != off.identity() and off.identity()["multilingual"] is False
    assert "multilingual" not in on.identity()
