"""Embedding workers without HTTP: a real out-of-memory in a real worker child is recovered by halving."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.settings import Settings
from orchestrator.workers import EmbeddingPool

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
        assert pool.metrics.oom_retries.value(profile="embedded") == 1
        assert worker.cap == 8
        counts = pool.metrics.batch_size.counts(profile="embedded")
        assert counts[8] == 2 and counts[16] == 2, counts
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
        assert pool.metrics.oom_retries.value(profile="embedded") == 1  # 2 -> 1, then give up
    finally:
        pool.close()
