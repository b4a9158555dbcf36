"""Embedding workers without HTTP: a real out-of-memory in a real worker child is recovered by halving;
idle workers stop and busy ones are recycled; micro-batches are cut by length and padded tokens (the
policy alone: test_batching.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.api.metrics import sample
from orchestrator.api.workers import EmbeddingPool
from orchestrator.settings import Settings
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

TEXTS = [f"sentence number {i} about a quick brown fox" for i in range(16)]


def test_oom_in_the_worker_halves_the_micro_batch_and_the_request_still_succeeds(tmp_path, reference_model):
    # Given a worker whose encode needs 100 MiB per text under a 1 GiB headroom: 16 texts cannot fit, 8 can
    settings = Settings(server_dir=tmp_path, embed_max_batch=16, embed_max_wait_ms=50)
    pool = EmbeddingPool(
        settings, module="tests.fixtures.worker_memhog", options={"mib_per_text": 100, "headroom_mib": 1024}
    )
    try:
        # When one request of 16 texts arrives
        result = pool.embed("embedded", TEXTS).result(timeout=300)
        worker = pool.worker("embedded")
        # Then the 16-text micro-batch ran out of memory, was retried as two of 8, and the answer is right
        assert pool.metrics.value("isostage_worker_oom_retries_total", profile="embedded") == 1
        assert worker.cap == 8

        def bucket(le: str) -> float:
            return pool.metrics.value("isostage_embedding_batch_size_bucket", profile="embedded", le=le)

        assert bucket("4.0") == 0 and bucket("8.0") == 2 and bucket("16.0") == 2, (
            "two micro-batches of 8 computed"
        )
        assert worker.pid is not None, "the worker survived its out-of-memory"
        np.testing.assert_allclose(
            result.vectors, reference_model.encode(TEXTS, normalize_embeddings=True), atol=1e-5
        )
    finally:
        pool.close()


def test_oom_at_batch_size_1_fails_the_request_with_advice(tmp_path):
    settings = Settings(server_dir=tmp_path, embed_max_batch=2, embed_max_wait_ms=50)
    pool = EmbeddingPool(
        settings, module="tests.fixtures.worker_memhog", options={"mib_per_text": 4096, "headroom_mib": 1024}
    )
    try:
        with pytest.raises(Exception) as caught:
            pool.embed("embedded", ["one", "two"]).result(timeout=300)
        assert getattr(caught.value, "status", None) == 503
        assert "even at batch size 1" in str(caught.value)
        assert (
            pool.metrics.value("isostage_worker_oom_retries_total", profile="embedded") == 1
        )  # 2 -> 1, then give up
    finally:
        pool.close()


def test_idle_worker_is_stopped_and_a_later_request_starts_a_fresh_one(tmp_path):
    import psutil

    from orchestrator.api.client import Client
    from orchestrator.api.server import start_in_thread

    # Given a server whose workers stop after 1.5 s without work
    server = start_in_thread(Settings(server_dir=tmp_path, port=0, worker_idle_s=1.5))
    try:
        with Client(server.url) as api:
            api.embed("first", model="embedded")
            pid = next(w.pid for w in api.health().workers if w.profile == "embedded")
            assert psutil.pid_exists(pid)

            # When nothing arrives for longer than the idle timeout
            def stopped() -> bool:
                return (
                    sample(api.metrics(), "isostage_worker_stops_total", profile="embedded", reason="idle")
                    == 1
                )

            deadline = time.monotonic() + 30
            while (psutil.pid_exists(pid) or not stopped()) and time.monotonic() < deadline:
                time.sleep(0.1)
            # Then the worker process is gone (its memory, and on a GPU its CUDA context, went back)
            assert not psutil.pid_exists(pid)
            assert stopped()
            worker = next(w for w in api.health().workers if w.profile == "embedded")
            assert not worker.running and worker.pid is None
            # And the next request is served by a new worker
            assert len(api.embed(["again", "and again"], model="embedded").data) == 2
            assert next(w.pid for w in api.health().workers if w.profile == "embedded") not in (None, pid)
    finally:
        server.stop()


def test_worker_is_recycled_after_n_micro_batches(tmp_path):
    settings = Settings(server_dir=tmp_path, worker_recycle_after=2, embed_max_wait_ms=0)
    pool = EmbeddingPool(settings)
    try:
        pids = []
        for text in ("one", "two", "three"):
            pool.embed("embedded", [text]).result(timeout=300)
            pids.append(pool.worker("embedded").pid)
        # two micro-batches on the first worker, which is then recycled; the third starts a new one
        assert pids[0] is not None and pids[1] is None and pids[2] not in (None, pids[0])
        assert pool.metrics.value("isostage_worker_restarts_total", profile="embedded", reason="recycle") == 1
        assert pool.metrics.value("isostage_worker_starts_total", profile="embedded") == 2
    finally:
        pool.close()


@pytest.mark.parametrize("budget", [8192, 600])
def test_long_texts_get_micro_batches_of_their_own_within_the_token_budget(tmp_path, reference_model, budget):
    import json

    # Given a worker held busy by a first request, while one request of 28 short and 4 long texts queues
    record = tmp_path / "batches.jsonl"
    # (a deadline far off: the admission check must not refuse on the throughput a busy machine measures
    # from the warm-up; this test is about how the queue is cut)
    settings = Settings(
        server_dir=tmp_path,
        embed_max_batch=32,
        embed_max_wait_ms=5,
        embed_max_batch_tokens=budget,
        request_timeout_s=3600,
    )
    pool = EmbeddingPool(settings, module="tests.fixtures.worker_controlled", options={"record": str(record)})
    long_text = " ".join(["planning the quarterly budget review"] * 60)  # beyond the model's 256 tokens
    short = [f"note {i} about the fox" for i in range(28)]
    texts = (
        short[:10]
        + [long_text + " one"]
        + short[10:20]
        + [long_text + " two", long_text + " three"]
        + short[20:]
        + [long_text + " four"]
    )
    try:
        pool.embed("embedded", ["warm up"]).result(timeout=300)
        busy = pool.embed("embedded", ["SLEEP 1"])
        wait_for(lambda: "SLEEP 1" in record.read_text(), timeout=60, what="the worker to be busy")
        result = pool.embed("embedded", texts).result(timeout=300)
        busy.result(timeout=300)
        batches = [json.loads(line) for line in record.read_text().splitlines()][2:]
        assert sorted(t for b in batches for t in b) == sorted(texts), "every text embedded exactly once"
        # Then the long texts were not padded into the short texts' micro-batch (32 texts and 8192 padded
        # tokens would allow it): every micro-batch is all short or all long
        for batch in batches:
            kinds = {t.startswith(long_text) for t in batch}
            assert len(kinds) == 1, f"a micro-batch mixes short and long texts: {[t[:20] for t in batch]}"
        longs = [b for b in batches if b[0].startswith(long_text)]
        if budget == 600:  # and no micro-batch holds more padded tokens than the budget: two long texts
            assert sorted(len(b) for b in longs) == [2, 2]
        else:
            assert [len(b) for b in longs] == [4]
        # and every request gets its rows in its own order
        np.testing.assert_allclose(
            result.vectors, reference_model.encode(texts, normalize_embeddings=True), atol=1e-5
        )
    finally:
        pool.close()
