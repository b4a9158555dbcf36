"""One typed settings object: the seeds' env var names, flags over env, child environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.stage_settings import HEAP_ENV
from orchestrator.settings import Settings


def test_seed_env_var_names_are_read(monkeypatch):
    monkeypatch.setenv("EMBEDDING_BATCH_SIZE", "64")
    monkeypatch.setenv("EMBEDDING_PROFILE", "quality")
    monkeypatch.setenv("PIPELINE_DEVICE", "cuda:1")
    s = Settings()
    assert (s.embedding_batch_size, s.embedding_profile, s.device) == (64, "quality", "cuda:1")


def test_explicit_values_beat_the_environment(monkeypatch):
    monkeypatch.setenv("ASR_BATCH_SIZE", "4")
    assert Settings(asr_batch_size=8).asr_batch_size == 8


def test_children_are_offline_unless_the_hub_is_allowed():
    env = Settings().child_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "HF_HUB_OFFLINE" not in Settings(allow_hub=True).child_env()


@pytest.mark.parametrize("bad", [{"device": "gpu"}, {"asr_batch_size": 0}, {"embedding_batch_size": -1}])
def test_invalid_values_are_rejected(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_speaker_settings_use_the_seed_names(monkeypatch):
    monkeypatch.setenv("VOICE_ENROLLMENT_BATCH_SIZE", "8")
    monkeypatch.setenv("SKIP_VOICE_EMBEDDINGS", "true")
    monkeypatch.setenv("ENABLE_FAST_PATH", "false")
    monkeypatch.setenv("SPEAKER_ENCODER", "ecapa")
    monkeypatch.setenv("MIN_SPEAKERS", "2")
    s = Settings()
    assert (s.voice_enrollment_batch_size, s.skip_voice_embeddings, s.enable_fast_path) == (8, True, False)
    assert (s.speaker_encoder, s.min_speakers) == ("ecapa", 2)


def test_the_diarizer_has_its_own_batch_size(monkeypatch):
    from orchestrator.registry import process_specs

    def batch(settings):
        return next(spec.batch_size for spec in process_specs(settings) if spec.name == "diarization")

    assert batch(Settings()) == 16 and Settings().voice_enrollment_batch_size == 4
    monkeypatch.setenv("DIARIZATION_BATCH_SIZE", "8")
    assert batch(Settings()) == 8
    with pytest.raises(ValidationError):
        Settings(diarization_batch_size=0)


def test_speaker_defaults_follow_seed_001():
    s = Settings()
    assert (s.voice_enrollment_batch_size, s.skip_voice_embeddings, s.enable_fast_path, s.speakers) == (
        4,
        False,
        True,
        True,
    )
    assert s.speaker_encoder == "campplus" and s.diarization_model == "auto"


@pytest.mark.parametrize(
    "bad",
    [
        {"min_speakers": 3, "max_speakers": 2},
        {"speaker_encoder": "xvector"},
        {"voice_enrollment_batch_size": 0},
        {"asr_chunk_size": 31},
    ],
)
def test_invalid_speaker_settings_are_rejected(bad):
    with pytest.raises(ValueError):
        Settings(**bad)


def test_bare_environment_names_of_other_programs_change_nothing(monkeypatch):
    # Given an environment that other programs set (docker, CI, shells)
    for name, value in {
        "HOST": "0.0.0.0",
        "PORT": "1",
        "DEVICE": "cuda",
        "FORCE": "true",
        "SPEAKERS": "false",
        "CHUNK_SIZE": "3",
        "OUTPUT_DIR": "/elsewhere",
    }.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    # Then none of them is read: only the documented names are
    assert (s.host, s.port, s.device, s.force, s.speakers, s.chunk_size) == (
        "127.0.0.1",
        8000,
        "auto",
        False,
        True,
        50,
    )
    assert str(s.output_dir) == "out"
    monkeypatch.setenv("PIPELINE_CHUNK_SIZE", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert (Settings().chunk_size, Settings().cuda_visible_devices) == (7, "1")
    # and constructor keywords still work by field name
    assert Settings(host="::1", chunk_size=2).chunk_size == 2


#: every (field, environment name, a valid value other than the default) the settings read, committed before
#: the fields were grouped by concern with derived names: no name may stop working
_ENV_NAMES = json.loads((Path(__file__).parent / "settings_env_names.json").read_text())


def test_the_documented_names_are_exactly_the_committed_ones():
    documented = {
        (name, alias)
        for name, field in Settings.model_fields.items()
        for alias in getattr(field.validation_alias, "choices", ())
        if alias != name
    }
    assert documented == {(name, env) for name, env, _ in _ENV_NAMES}


@pytest.mark.parametrize(("name", "env", "value"), _ENV_NAMES, ids=[env for _, env, _ in _ENV_NAMES])
def test_every_environment_name_sets_its_field(monkeypatch, name, env, value):
    monkeypatch.setenv(env, value)
    assert getattr(Settings(), name) != getattr(Settings.model_construct(), name)
    monkeypatch.delenv(env)
    assert getattr(Settings(), name) == getattr(Settings.model_construct(), name)


def test_an_undocumented_name_changes_nothing(monkeypatch):
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("LANGID_ONLY", "true")
    monkeypatch.setenv("CAPTION_MAX_S", "3")  # the legacy CAPTION_MAX_SECONDS, not the derived name
    s = Settings()
    assert (s.host, s.langid_only, s.caption_max_s) == ("127.0.0.1", False, 7.0)


def test_a_field_name_is_derived_from_its_group_prefix():
    from orchestrator.settings import AsrOptions, EmbeddingServerOptions, OutputOptions, env_names

    assert OutputOptions.env_name("output_dir") == "PIPELINE_OUTPUT_DIR"
    # the group's word at the start of a field name is not repeated
    assert AsrOptions.env_name("asr_model") == "ASR_MODEL"
    assert EmbeddingServerOptions.env_name("embed_max_batch") == "EMBEDDING_MAX_BATCH"
    assert EmbeddingServerOptions.env_name("worker_idle_s") == "EMBEDDING_WORKER_IDLE_S"
    # the seeds' names: a group without prefix
    assert env_names("voice_enrollment_batch_size") == ("VOICE_ENROLLMENT_BATCH_SIZE",)
    # the exceptions are listed, not derived
    assert env_names("caption_max_s") == ("CAPTION_MAX_SECONDS",)
    # the children's heap policy is read under the name the children see it by
    assert env_names("child_heap") == (HEAP_ENV,)


def test_every_field_belongs_to_one_group_and_every_exception_is_a_field():
    from orchestrator.settings import GROUP_OF, GROUPS, LEGACY_ENV

    assert sum(len(group.model_fields) for group in GROUPS) == len(Settings.model_fields)
    assert set(LEGACY_ENV) <= set(Settings.model_fields)
    # an exception that the rule would give anyway is no exception
    assert all(names != (GROUP_OF[name].env_name(name),) for name, names in LEGACY_ENV.items())


def test_a_caption_minimum_above_the_maximum_is_refused_in_one_line():
    import subprocess
    import sys

    from tests.conftest import ROOT

    with pytest.raises(
        ValidationError, match=r"CAPTION_MIN_SECONDS \(8\) must not be above CAPTION_MAX_SECONDS"
    ):
        Settings(caption_min_s=8.0, caption_max_s=7.0)
    assert Settings(caption_min_s=7.0, caption_max_s=7.0).caption_min_s == 7.0
    # the command line says so in one line and exits 2, before any work
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "process", "nothing.wav", "--output", "unused"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CAPTION_MIN_SECONDS": "8", "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CAPTION_MIN_SECONDS (8) must not be above CAPTION_MAX_SECONDS (7)" in lines[0]


def test_language_codes_are_whispers_and_others_are_refused():
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    from contracts.models import WHISPER_LANGUAGES

    assert sorted(WHISPER_LANGUAGES) == sorted(LANGUAGES)
    assert (
        Settings(asr_language=" DE ").asr_language == "de" and Settings(asr_language="").asr_language is None
    )
    assert Settings(asr_languages="en, yue,haw").asr_languages == ["en", "haw", "yue"]
    for bad in ({"asr_language": "zz"}, {"asr_language": "english"}, {"asr_languages": "en,xx"}):
        with pytest.raises(ValidationError, match="not a language code Whisper knows"):
            Settings(**bad)
    with pytest.raises(ValidationError, match="output folder is empty"):
        Settings(output_dir="  ")


def test_a_token_of_spaces_is_no_token_and_a_public_address_is_refused_without_one():
    from contracts.errors import SettingsError

    assert Settings(api_token="   ").api_token is None
    assert Settings(api_token=" s3cret\n").api_token.get_secret_value() == "s3cret"
    with pytest.raises(SettingsError, match="exposes the API beyond this machine"):
        Settings(api_token=" ", host="0.0.0.0").check_serve()
