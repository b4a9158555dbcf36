"""Embedding workers without HTTP: a real out-of-memory in a real worker child is recovered by halving."""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.settings import Settings
from orchestrator.api.metrics import sample
from orchestrator.api.workers import EmbeddingPool

pytestmark = pytest.mark.slow

TEXTS = [f"sentence number {i} about a quick brown fox" for i in range(16)]


def test_oom_in_the_worker_halves_the_micro_batch_and_the_request_still_succeeds(tmp_path, reference_model):
    # Given a worker whose encode needs 100 MiB per text under a 1 GiB headroom: 16 texts cannot fit, 8 can
    settings = Settings(server_dir=tmp_path, embed_max_batch=16, embed_max_wait_ms=50)
    pool = EmbeddingPool(settings, module="tests.fixtures.worker_memhog",
                         options={"mib_per_text": 100, "headroom_mib": 1024})
    try:
        # When one request of 16 texts arrives
        result = pool.embed("embedded", TEXTS).result(timeout=300)
        worker = pool.worker("embedded")
        # Then the 16-text micro-batch ran out of memory, was retried as two of 8, and the answer is right
        assert pool.metrics.value("isostage_worker_oom_retries_total", profile="embedded") == 1
        assert worker.cap == 8
        bucket = lambda le: pool.metrics.value("isostage_embedding_batch_size_bucket", profile="embedded", le=le)  # noqa: E731
        assert bucket("4.0") == 0 and bucket("8.0") == 2 and bucket("16.0") == 2, "two micro-batches of 8 computed"
        assert worker.pid is not None, "the worker survived its out-of-memory"
        np.testing.assert_allclose(result.vectors, reference_model.encode(TEXTS, normalize_embeddings=True), atol=1e-5)
    finally:
        pool.close()


def test_oom_at_batch_size_1_fails_the_request_with_advice(tmp_path):
    settings = Settings(server_dir=tmp_path, embed_max_batch=2, embed_max_wait_ms=50)
    pool = EmbeddingPool(settings, module="tests.fixtures.worker_memhog",
                         options={"mib_per_text": 4096, "headroom_mib": 1024})
    try:
        with pytest.raises(Exception) as caught:
            pool.embed("embedded", ["one", "two"]).result(timeout=300)
        assert getattr(caught.value, "status", None) == 503
        assert "even at batch size 1" in str(caught.value)
        assert pool.metrics.value("isostage_worker_oom_retries_total", profile="embedded") == 1  # 2 -> 1, then give up
    finally:
        pool.close()


def test_idle_worker_is_stopped_and_a_later_request_starts_a_fresh_one(tmp_path):
    from orchestrator.api.client import Client
    from orchestrator.api.server import start_in_thread

    import psutil

    # Given a server whose workers stop after 1.5 s without work
    server = start_in_thread(Settings(server_dir=tmp_path, port=0, worker_idle_s=1.5))
    try:
        with Client(server.url) as api:
            api.embed("first", model="embedded")
            pid = next(w.pid for w in api.health().workers if w.profile == "embedded")
            assert psutil.pid_exists(pid)
            # When nothing arrives for longer than the idle timeout
            stopped = lambda: sample(api.metrics(), "isostage_worker_stops_total", profile="embedded", reason="idle") == 1  # noqa: E731
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
