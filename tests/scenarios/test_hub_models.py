"""The production embedding models as a user's Hugging Face cache holds them, offline, through the real
pipeline: ``process`` with the speed (bge-small-en-v1.5) and the quality (gte-Qwen2-1.5B-instruct) profile
loads the cached model (no fallback), names it with its revision, and writes vectors of its real dimension;
``/v1/embeddings`` gives a query its instruction and a document none.

The cache holds stand-ins built from the real configurations with random weights
(:mod:`tests.fixtures.hub_standins`): the loading code path is the real one, the vectors mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import openai
import pytest

from contracts.models import EMBEDDING_PROFILES
from tests.conftest import MEDIA, ROOT
from tests.fixtures.hub_standins import BGE, DIMENSIONS, GTE, GTE_QUERY_PROMPT, REVISIONS, write_cache

pytestmark = pytest.mark.slow

TEXTS = ["Who sells sea shells?", "Please call Stella and ask her to bring these things."]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    write_cache(home)
    return home


def _offline_env(hf_home) -> dict[str, str]:
    return {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def runs(hf_home, tmp_path_factory):
    """One output folder processed with the speed profile, then with the quality profile (the transcript is
    reused, the embeddings redone): each run's report, embeddings artifact and vectors."""
    out = tmp_path_factory.mktemp("out")
    results = {}
    for profile in ("speed", "quality"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "process",
                str(MEDIA / "speech.wav"),
                "--output",
                str(out),
            ]
            + ["--embedding-profile", profile, "--offline", "--no-speakers", "--device", "cpu"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**_offline_env(hf_home), "ASR_MODEL": "embedded", "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results[profile] = {
            "console": done.stdout + done.stderr,
            "report": json.loads((out / "run-report.json").read_text()),
            "artifact": json.loads((out / "speech" / "embeddings.json").read_text()),
            "vectors": np.load(out / "speech" / "embeddings.npy"),
            "plan": subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "process", str(MEDIA / "speech.wav")]
                + ["--output", str(out), "--embedding-profile", profile, "--offline", "--no-speakers"]
                + ["--device", "cpu", "--dry-run"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
                env={**_offline_env(hf_home), "ASR_MODEL": "embedded", "PYTHONPATH": str(ROOT)},
            ).stdout,
        }
    return results


@pytest.mark.parametrize("profile", ["speed", "quality"])
def test_the_cached_model_runs_named_with_its_revision(runs, profile):
    repo = EMBEDDING_PROFILES[profile]
    run = runs[profile]
    art, report = run["artifact"], run["report"]
    assert art["fallback_reason"] is None and not report["substitutions"], run["console"][-2000:]
    assert art["model"] == f"{repo}@{REVISIONS[repo]}" and art["requested_model"] == repo
    assert art["profile"] == profile
    (attempt,) = [a for s in report["stages"] if s["stage"] == "embeddings" for a in s["attempts"]]
    assert attempt["model"] == art["model"] and attempt["outcome"] == "ok"
    assert "all-MiniLM" not in run["console"], "no fallback, no substitution note"


@pytest.mark.parametrize("profile", ["speed", "quality"])
def test_vectors_have_the_real_dimension_and_unit_norm(runs, profile):
    repo = EMBEDDING_PROFILES[profile]
    art, vectors = runs[profile]["artifact"], runs[profile]["vectors"]
    assert vectors.shape == (art["count"], DIMENSIONS[repo]) == (art["count"], art["dimension"])
    assert art["count"] >= 1
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_a_rerun_plans_nothing_for_the_cached_model(runs):
    """The plan resolves the same ``repo@revision`` the child recorded: the artifact is current."""
    for profile in ("speed", "quality"):
        repo = EMBEDDING_PROFILES[profile]
        assert f"embeddings [{repo}@{REVISIONS[repo]}]: 1 to reuse, 0 to redo" in runs[profile]["plan"]


@pytest.fixture(scope="module")
def client(hf_home, tmp_path_factory):
    from orchestrator.api.server import start_in_thread
    from orchestrator.settings import Settings

    with pytest.MonkeyPatch.context() as patch:  # the embedding workers (spawned) read the cache from here
        for name, value in _offline_env(hf_home).items():
            if os.environ.get(name) != value:
                patch.setenv(name, value)
        running = start_in_thread(
            Settings(
                server_dir=tmp_path_factory.mktemp("server"),
                port=0,
                input_roots=[tmp_path_factory.mktemp("root")],
                embedding_profile="quality",
                allow_hub=False,
                device="cpu",
            )
        )
        http = httpx.Client(timeout=600)
        yield openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, http_client=http)
        http.close()
        running.stop()


def _vectors(client: openai.OpenAI, model: str, texts: list[str], input_type: str | None) -> np.ndarray:
    extra = {"input_type": input_type} if input_type else None
    response = client.embeddings.create(input=texts, model=model, encoding_format="float", extra_body=extra)
    return np.asarray([row.embedding for row in response.data], dtype=np.float32)


@pytest.mark.parametrize("profile", ["speed", "quality"])
def test_a_query_gets_its_instruction_and_a_document_none(client, profile):
    """gte-Qwen2: the query prompt of its configuration; bge v1.5: the card's instruction (its configuration
    names none). A document gets no prompt: the same vectors as no input type."""
    query = _vectors(client, profile, TEXTS, "query")
    document = _vectors(client, profile, TEXTS, "document")
    default = _vectors(client, profile, TEXTS, None)
    assert query.shape == (len(TEXTS), DIMENSIONS[EMBEDDING_PROFILES[profile]])
    assert np.abs(query - document).max() > 0.01, "a query is embedded apart from a document"
    np.testing.assert_allclose(document, default, atol=1e-5)
    instruction = (
        GTE_QUERY_PROMPT
        if profile == "quality"
        else "Represent this sentence for searching relevant passages: "
    )
    np.testing.assert_allclose(
        query, _vectors(client, profile, [instruction + t for t in TEXTS], None), atol=1e-4
    )


#: run in a child with the stand-in cache: gte-Qwen2 as the stage loads it, probed (JSON on stdout)
GTE_PROBE = """
import json
import numpy as np
import torch
from stages.embeddings import load_sentence_transformer

texts = json.loads(__import__("sys").argv[1])
model = load_sentence_transformer("Alibaba-NLP/gte-Qwen2-1.5B-instruct", "cpu", False)
auto = model[0].auto_model
out = {"module": type(auto).__module__, "use_cache": auto.config.use_cache,
       "padding_side": model.tokenizer.padding_side}
ids = model.tokenizer(texts[1])["input_ids"]
later = list(ids)
later[-2] = ids[3]  # the last word's token (the end token follows it) changed
for implementation in ("sdpa", "eager"):
    auto.config._attn_implementation = implementation
    with torch.no_grad():
        first = [auto(input_ids=torch.tensor([row])).last_hidden_state[0, 0] for row in (ids, later)]
    row = {"first_token_change": float((first[0] - first[1]).abs().max())}
    for side in ("left", "right"):
        model.tokenizer.padding_side = side
        batched = model.encode(texts, batch_size=len(texts))
        single = np.stack([model.encode([text])[0] for text in texts])
        row[side] = float(np.abs(batched - single).max())
    out[implementation] = row
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gte_probe(hf_home):
    """gte-Qwen2's stand-in as the stage loads it, probed once: its attention and its padding."""
    texts = [TEXTS[0], TEXTS[1] + " From the store, too.", "Six spoons"]  # three lengths: padding in a batch
    done = subprocess.run(
        [sys.executable, "-c", GTE_PROBE, json.dumps(texts)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**_offline_env(hf_home), "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gte_runs_its_own_modelling_code_without_a_cache(gte_probe):
    """The repository's ``modeling_qwen.py`` (``trust_remote_code``), with the key/value cache off: that file
    asks the cache for ``get_usable_length``, which transformers >= 4.56 lacks."""
    assert gte_probe["module"].endswith(".modeling_qwen"), gte_probe["module"]
    assert gte_probe["use_cache"] is False


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_gte_attention_is_bidirectional(gte_probe, implementation):
    """The first token's state changes when a later token changes: no causal mask (under one, the first token
    sees itself only and its state stays exactly the same)."""
    assert gte_probe[implementation]["first_token_change"] > 1e-3


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_gte_batched_texts_embed_as_each_alone(gte_probe, implementation, side):
    """Texts of three lengths encoded in one padded batch give the vectors each gives alone: padding is
    masked for every query, before and after it (the stage pads on the left)."""
    assert gte_probe["padding_side"] == "left"
    assert gte_probe[implementation][side] < 1e-5


def test_the_standins_are_laid_out_as_the_hub_client_caches(hf_home):
    """snapshots/<rev>/ files are links into blobs/, refs/main names the revision, and the revision resolves
    as the parent reads it (``orchestrator.models.choice``)."""
    for repo in (BGE, GTE):
        root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
        assert (root / "refs" / "main").read_text() == REVISIONS[repo]
        snapshot = root / "snapshots" / REVISIONS[repo]
        files = [p for p in snapshot.rglob("*") if not p.is_dir()]
        assert files and all(p.is_symlink() and p.resolve().parent == root / "blobs" for p in files)
    code = (
        "from orchestrator.models.choice import _repo; "
        f"print(_repo({BGE!r}, False)); print(_repo({GTE!r}, False))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=_offline_env(hf_home)
    )
    assert done.stdout.split() == [f"{BGE}@{REVISIONS[BGE]}", f"{GTE}@{REVISIONS[GTE]}"], done.stderr
