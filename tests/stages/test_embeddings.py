"""sentence-transformers embeddings: profiles, offline fallback, equality with plain encode."""

from __future__ import annotations

import numpy as np
import pytest

from contracts import (
    EmbeddingsArtifact,
    StageRequest,
    TranscriptArtifact,
    WorkItem,
    load_artifact,
    save_model,
)
from contracts.errors import ModelUnavailableError
from contracts.models import EMBEDDING_FALLBACK
from stages.embeddings import PROFILES, EmbeddingsStage, embedded_model_path, resolve_model
from tests.conftest import stage_settings

pytestmark = pytest.mark.slow

TEXTS = ["The quick brown fox jumps over the lazy dog.", "She sells sea shells.", "", "Please call Stella."]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture()
def transcript_json(tmp_path):
    art = TranscriptArtifact(
        item_id="t",
        fingerprint="fp",
        source="/x.mp4",
        language="en",
        segments=[{"id": i, "start": float(i), "end": i + 0.5, "text": t} for i, t in enumerate(TEXTS)],
        model="m",
        requested_model="embedded",
        device="cpu",
        compute_type="int8",
        batch_size=1,
        duration_s=5.0,
    )
    return save_model(art, tmp_path / "transcript.json")


def _request(tmp_path, transcript_json, batch_size=2, **settings) -> StageRequest:
    return StageRequest(
        request_id="r",
        stage="embeddings",
        module="stages.embeddings",
        batch_size=batch_size,
        device="cpu",
        settings=stage_settings("embeddings", **settings),
        result_path=str(tmp_path / "res.json"),
        items=[
            WorkItem(
                id="t",
                inputs={"transcript": str(transcript_json)},
                output=str(tmp_path / "embeddings.json"),
                fingerprint="fp-emb",
            )
        ],
    )


def test_profiles_keep_their_production_models():
    assert resolve_model("speed") == PROFILES["speed"] == "BAAI/bge-small-en-v1.5"
    assert resolve_model("quality") == "Alibaba-NLP/gte-Qwen2-1.5B-instruct"
    assert resolve_model("embedded") == str(embedded_model_path())
    assert resolve_model("/models/my-st") == "/models/my-st"


def test_unavailable_profile_falls_back_to_embedded_and_says_so(tmp_path, transcript_json):
    result = EmbeddingsStage().run(_request(tmp_path, transcript_json, profile="speed"))
    assert result.items[0].ok
    art = load_artifact(tmp_path / "embeddings.json", EmbeddingsArtifact)
    assert art.requested_model == "BAAI/bge-small-en-v1.5" and art.profile == "speed"
    assert art.model == EMBEDDING_FALLBACK and art.fallback_reason, "named, not the wheel's path"
    assert result.model == art.model


def test_vectors_equal_plain_sentence_transformers_encode_and_are_unit_norm(tmp_path, transcript_json):
    from sentence_transformers import SentenceTransformer

    EmbeddingsStage().run(_request(tmp_path, transcript_json, profile="embedded", batch_size=3))
    art = load_artifact(tmp_path / "embeddings.json", EmbeddingsArtifact)
    vectors = np.load(tmp_path / art.sidecar)
    assert vectors.shape == (len(TEXTS), 384) == (art.count, art.dimension) and art.fallback_reason is None
    expected = SentenceTransformer(str(embedded_model_path()), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_without_fallback_an_unavailable_model_is_an_error(tmp_path, transcript_json):
    with pytest.raises(ModelUnavailableError, match="bge-small"):
        EmbeddingsStage().run(_request(tmp_path, transcript_json, profile="speed", fallback=False))


def test_texts_of_several_inputs_share_one_stream_and_are_split_back(tmp_path, reference_model):
    """Cross-input packing: four transcripts (one without segments, one unreadable) in one request."""
    texts = {
        "a": TEXTS,
        "b": [],
        "c": [
            "A much longer sentence about rivers, bridges and the people who cross "
            "them every single morning.",
            "Short.",
        ],
        "d": ["Yes, hello."] * 5,
    }
    items, seen = [], []
    for name, lines in texts.items():
        art = TranscriptArtifact(
            item_id=name,
            fingerprint="fp",
            source=f"/{name}.mp4",
            language="en",
            segments=[{"id": i, "start": float(i), "end": i + 0.5, "text": t} for i, t in enumerate(lines)],
            model="m",
            requested_model="embedded",
            device="cpu",
            compute_type="int8",
            batch_size=1,
            duration_s=5.0,
        )
        items.append(
            WorkItem(
                id=name,
                inputs={"transcript": str(save_model(art, tmp_path / f"{name}.t.json"))},
                output=str(tmp_path / f"{name}.json"),
                fingerprint="fp",
            )
        )
    (tmp_path / "broken.t.json").write_text("{}")
    items.insert(
        2,
        WorkItem(
            id="broken",
            inputs={"transcript": str(tmp_path / "broken.t.json")},
            output=str(tmp_path / "broken.json"),
            fingerprint="fp",
        ),
    )
    stage = EmbeddingsStage()
    write = stage._write_in_flight
    stage._write_in_flight = lambda req, in_flight: (seen.append(in_flight.ids), write(req, in_flight))
    result = stage.run(
        StageRequest(
            request_id="r",
            stage="embeddings",
            module="stages.embeddings",
            batch_size=4,
            device="cpu",
            settings=stage_settings("embeddings", profile="embedded"),
            result_path=str(tmp_path / "res.json"),
            inflight_path=str(tmp_path / "in.json"),
            items=items,
        )
    )
    by_id = {r.id: r for r in result.items}
    assert not by_id["broken"].ok and "upstream artifact unusable" in by_id["broken"].error
    assert ["a", "b", "c", "d"] in seen, seen  # one encode stream for the four readable inputs
    for name, lines in texts.items():
        assert by_id[name].ok, by_id[name].error
        art = load_artifact(tmp_path / f"{name}.json", EmbeddingsArtifact)
        vectors = np.load(tmp_path / art.sidecar)
        assert vectors.shape == (len(lines), 384) == (art.count, art.dimension)
        if lines:
            np.testing.assert_allclose(
                vectors, reference_model.encode(lines, normalize_embeddings=True), atol=1e-5
            )


def test_qwen2_runs_in_bfloat16_on_cuda_and_the_rest_in_float16():
    """float16 overflows in Qwen2's MLPs (inf/NaN vectors): bfloat16 where the card has it, else float32
    (never float16)."""
    from stages.embeddings import cuda_dtype

    assert cuda_dtype("qwen2", bf16_supported=True) == "bfloat16"
    assert cuda_dtype("qwen2", bf16_supported=False) == "float32"
    assert cuda_dtype("qwen3", bf16_supported=False) == "float32"
    assert cuda_dtype("bert", bf16_supported=True) == "float16"
    assert cuda_dtype(None, bf16_supported=True) == "float16"


def test_an_empty_configured_prompt_leaves_the_card_instruction():
    """sentence-transformers 5 fills in empty "query"/"document" prompts for a configuration without any."""
    from stages.embeddings import QUERY_PROMPTS, prompt_for

    class Model:
        prompts = {"query": "", "document": ""}

    name = "BAAI/bge-small-en-v1.5@5c38ec7c405ec4b44b94cc5a9bb96e735b38267a"
    assert prompt_for(Model(), name, "query") == QUERY_PROMPTS["BAAI/bge-small-en-v1.5"]
    assert prompt_for(Model(), name, "document") == ""


def test_models_load_without_a_key_value_cache():
    """Encoding reads no cache; gte-Qwen2's own modelling code fails on transformers >= 4.56 with one on (it
    asks the cache for ``get_usable_length``). Its stand-in: ``tests/scenarios/test_hub_models.py``."""
    from stages.embeddings import load_sentence_transformer

    model = load_sentence_transformer(str(embedded_model_path()), "cpu", allow_hub=False)
    assert model[0].auto_model.config.use_cache is False


def test_a_cached_snapshot_without_its_weights_falls_back_naming_the_file(
    tmp_path, transcript_json, monkeypatch
):
    """A pull cut off between files leaves bge-small's snapshot without ``model.safetensors``: the fallback's
    reason names that file, not the loader's ``'NoneType' object has no attribute 'endswith'``."""
    from huggingface_hub import constants

    revision = "5" * 40
    folder = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5"
    (folder / "snapshots" / revision).mkdir(parents=True)
    (folder / "snapshots" / revision / "config.json").write_text('{"model_type": "bert"}')
    (folder / "snapshots" / revision / "modules.json").write_text("[]")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    result = EmbeddingsStage().run(_request(tmp_path, transcript_json, profile="speed"))
    assert result.items[0].ok
    art = load_artifact(tmp_path / "embeddings.json", EmbeddingsArtifact)
    assert art.model == EMBEDDING_FALLBACK
    assert "lacks model.safetensors (or pytorch_model.bin)" in art.fallback_reason, art.fallback_reason
