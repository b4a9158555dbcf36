"""``input_type`` on /v1/embeddings, through the official ``openai`` client (``extra_body``), against a real
server with real worker children: a model with prompts embeds a query apart from a document, one without
embeds them alike."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import openai
import pytest

from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from stages.embeddings import QUERY_PROMPTS, embedded_model_path, prompt_for

pytestmark = pytest.mark.slow

QUERY_PROMPT = "Represent this question for searching relevant passages: "
TEXTS = ["Who sells sea shells?", "Please call Stella and ask her to bring these things."]


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    """The embedded all-MiniLM-L6-v2 with a query prompt in its sentence-transformers configuration (as
    gte-Qwen2-instruct has one), and no document prompt."""
    folder = tmp_path_factory.mktemp("models") / "minilm-prompted"
    shutil.copytree(embedded_model_path(), folder)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prompts": {"query": QUERY_PROMPT}}))
    return folder


@pytest.fixture(scope="module")
def client(tmp_path_factory, prompted):
    running = start_in_thread(
        Settings(
            server_dir=tmp_path_factory.mktemp("server"),
            port=0,
            input_roots=[tmp_path_factory.mktemp("root")],
            embedding_profile="embedded",
            embedding_models=[str(prompted)],
            device="cpu",
        )
    )
    http = httpx.Client(timeout=600)
    yield openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, http_client=http)
    http.close()
    running.stop()


def _vectors(client: openai.OpenAI, model: str, input_type: str | None) -> np.ndarray:
    extra = {"input_type": input_type} if input_type else None
    response = client.embeddings.create(input=TEXTS, model=model, encoding_format="float", extra_body=extra)
    return np.asarray([row.embedding for row in response.data], dtype=np.float32)


def test_a_query_gets_the_model_query_prompt_and_a_document_none(client, prompted, reference_model):
    query = _vectors(client, str(prompted), "query")
    document = _vectors(client, str(prompted), "document")
    default = _vectors(client, str(prompted), None)
    assert np.abs(query - document).max() > 0.05, "a query is embedded apart from a document"
    np.testing.assert_allclose(document, default, atol=1e-5)  # no document prompt, no default prompt
    expected = reference_model.encode([QUERY_PROMPT + t for t in TEXTS], normalize_embeddings=True)
    np.testing.assert_allclose(query, expected, atol=1e-5)  # the prompt as the model's configuration says


def test_a_model_without_prompts_embeds_queries_and_documents_alike(client):
    query = _vectors(client, "embedded", "query")
    document = _vectors(client, "embedded", "document")
    np.testing.assert_allclose(query, document, atol=1e-6)


def test_usage_counts_the_query_prompt_the_model_saw(client, prompted, reference_model):
    query = client.embeddings.create(input=TEXTS, model=str(prompted), extra_body={"input_type": "query"})
    plain = client.embeddings.create(input=TEXTS, model=str(prompted))
    tokenizer = reference_model.tokenizer
    assert plain.usage.prompt_tokens == sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
    with_prompt = sum(len(tokenizer(QUERY_PROMPT + t)["input_ids"]) for t in TEXTS)
    assert query.usage.prompt_tokens == query.usage.total_tokens == with_prompt > plain.usage.prompt_tokens


def test_the_answer_says_whether_the_input_type_was_applied(client, prompted):
    """The official client parses the extra field (and keeps it); the header says the same."""
    for model, applied in (("embedded", False), (str(prompted), True)):
        for input_type in ("query", "document"):
            raw = client.embeddings.with_raw_response.create(
                input=TEXTS, model=model, extra_body={"input_type": input_type}
            )
            assert raw.headers["x-input-type-applied"] == str(applied).lower(), (model, input_type)
            parsed = raw.parse()
            assert len(parsed.data) == len(TEXTS) and parsed.model_extra == {"input_type_applied": applied}
    untyped = client.embeddings.with_raw_response.create(input=TEXTS, model="embedded")
    assert "x-input-type-applied" not in untyped.headers and not untyped.parse().model_extra


def test_an_unknown_input_type_is_refused(client):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(input=TEXTS, model="embedded", extra_body={"input_type": "passage"})


def test_prompts_come_from_the_model_then_from_its_card():
    class Model:
        prompts = {"query": "Instruct: find passages\nQuery: "}

    assert prompt_for(Model(), "Alibaba-NLP/gte-Qwen2-1.5B-instruct", "query") == Model.prompts["query"]
    assert prompt_for(Model(), "Alibaba-NLP/gte-Qwen2-1.5B-instruct", "document") == ""
    assert prompt_for(object(), "BAAI/bge-small-en-v1.5", "query") == QUERY_PROMPTS["BAAI/bge-small-en-v1.5"]
    assert prompt_for(object(), "BAAI/bge-small-en-v1.5", None) is None  # the model's own default
