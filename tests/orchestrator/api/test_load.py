"""The embeddings API under load, against a real uvicorn on 127.0.0.1 and real worker children.

The worker is ``tests.fixtures.worker_controlled``: the real model, plus texts that make it sleep, hang or
raise, and a record of every micro-batch it received (what the worker actually saw). One server for the
module: the model is loaded once (and again only where a test kills the worker on purpose).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import openai
import psutil
import pytest

from orchestrator.api.metrics import sample
from orchestrator.api.server import start_in_thread
from orchestrator.api.workers import EmbeddingPool
from orchestrator.settings import Settings
from tests.conftest import wait_for

NAME = "sentence-transformers/all-MiniLM-L6-v2"
QUEUE_BOUND = 8
BATCH_LIMIT_S = 10.0
GATE_S = 8.0  # how long a busy worker may wait for its test: the test opens the gate as soon as it is done


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    record = tmp_path_factory.mktemp("record") / "batches.jsonl"
    record.touch()
    settings = Settings(
        server_dir=tmp_path_factory.mktemp("server"),
        port=0,
        embed_max_batch=16,
        embed_max_wait_ms=20,
        embed_max_queued_texts=QUEUE_BOUND,
        embed_batch_timeout_s=BATCH_LIMIT_S,
        max_inputs=QUEUE_BOUND,
        worker_start_timeout_s=120,
    )
    pool = EmbeddingPool(settings, module="tests.fixtures.worker_controlled", options={"record": str(record)})
    running = start_in_thread(settings, pool)
    running.record = record
    response = _post(running, ["warm up"])  # load the model once, here
    assert response.status_code == 200, response.text
    yield running
    running.stop()


def _post(server, texts, **kwargs) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": texts, "model": "embedded"},
        timeout=kwargs.pop("timeout", 120),
        **kwargs,
    )


def _in_thread(server, texts, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["response"] = _post(server, texts, **kwargs)
        except httpx.HTTPError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _batches(server) -> list[list[str]]:
    return [json.loads(line) for line in server.record.read_text().splitlines()]


def _seen(server, text: str) -> bool:
    return any(text in batch for batch in _batches(server))


def _metric(server, name: str, **labels) -> float:
    return sample(httpx.get(f"{server.url}/metrics").text, name, **labels)


def _queued(server) -> float:
    return _metric(server, "isostage_embedding_queue_length", profile="embedded")


def _busy(server) -> tuple[threading.Thread, dict, Callable[[], None]]:
    """Occupy the worker with a micro-batch that waits for a gate file; returns once the worker has it, with
    the function that opens the gate. The worker waits at most GATE_S (below the micro-batch limit)."""
    gate = server.record.parent / f"gate-{len(_batches(server))}"
    text = f"WAIT {gate} {GATE_S}"
    thread, out = _in_thread(server, [text])
    wait_for(lambda: _seen(server, text), timeout=60, what="the worker to take the waiting text")
    return thread, out, gate.touch


def test_past_the_queue_bound_429_with_retry_after_then_recovery(server):
    # Given a busy worker and a queue holding its bound of texts
    sleeper, slept, release = _busy(server)
    filler, filled = _in_thread(server, [f"queued text {i}" for i in range(QUEUE_BOUND)])
    wait_for(lambda: _queued(server) == QUEUE_BOUND, timeout=60, what="the queue to fill")
    # When one more text arrives
    refused = _post(server, ["one text too many"])
    # Then it is refused with 429, OpenAI's error shape and Retry-After, and the official client sees a RateLimitError
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert (
        refused.json()["error"]["type"] == "rate_limit_error"
        and refused.json()["error"]["code"] == "queue_full"
    )
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(input="also too many", model="embedded")
    # And once the queue has drained, texts are accepted again
    release()
    sleeper.join()
    filler.join()
    assert slept["response"].status_code == 200 and filled["response"].status_code == 200
    assert len(filled["response"].json()["data"]) == QUEUE_BOUND
    assert _post(server, ["accepted after the drain"]).status_code == 200
    assert not _seen(server, "one text too many") and not _seen(server, "also too many")


def test_a_disconnected_clients_texts_never_reach_the_worker(server):
    dropped = _metric(server, "isostage_embedding_dropped_texts_total", profile="embedded")
    # Given a busy worker
    sleeper, slept, release = _busy(server)
    # When a client queues two texts and goes away before they are embedded
    with pytest.raises(httpx.ReadTimeout):
        _post(server, ["gone client text one", "gone client text two"], timeout=0.5)
    wait_for(
        lambda: _metric(server, "isostage_embedding_dropped_texts_total", profile="embedded") == dropped + 2,
        timeout=60,
        what="the server to drop the texts",
    )
    release()
    sleeper.join()
    assert slept["response"].status_code == 200
    # Then the worker went on with later texts, and never received the dropped ones
    assert _post(server, ["a text after the disconnect"]).status_code == 200
    assert _seen(server, "a text after the disconnect")
    assert not _seen(server, "gone client text one") and not _seen(server, "gone client text two")
    assert _queued(server) == 0


def test_one_bad_text_in_a_busy_micro_batch_fails_only_its_request(server):
    bad_before = _metric(server, "isostage_embedding_bad_texts_total", profile="embedded")
    sleeper, _, release = _busy(server)
    # Given three requests queued together while the worker is busy, one with a text the worker cannot embed
    good_a, out_a = _in_thread(server, ["good text one", "good text two"])
    poisoned, out_p = _in_thread(server, ["fine here", "POISON pill"])
    good_b, out_b = _in_thread(server, ["another good one"])
    wait_for(lambda: _queued(server) == 5, timeout=60, what="the three requests to queue")
    release()
    for thread in (sleeper, good_a, poisoned, good_b):
        thread.join()
    # Then they shared a micro-batch that failed ...
    assert any("POISON pill" in batch and "good text one" in batch for batch in _batches(server))
    # ... and only the request holding the bad text fails, with a 400 naming it and no stack trace
    bad = out_p["response"]
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["code"] == "invalid_input" and bad.json()["error"]["param"] == "input[1]"
    assert "POISON" in bad.json()["error"]["message"] and "Traceback" not in bad.text
    assert out_a["response"].status_code == 200 and out_b["response"].status_code == 200
    alone = np.array(
        [d["embedding"] for d in _post(server, ["good text one", "good text two"]).json()["data"]]
    )
    shared = np.array([d["embedding"] for d in out_a["response"].json()["data"]])
    np.testing.assert_allclose(shared, alone, atol=1e-5)
    assert _metric(server, "isostage_embedding_bad_texts_total", profile="embedded") == bad_before + 1


def test_a_hung_worker_is_killed_and_replaced_and_only_the_hanging_request_fails(server):
    health = httpx.get(f"{server.url}/health").json()
    old_pid = next(w["pid"] for w in health["workers"] if w["profile"] == "embedded")
    restarts = _metric(server, "isostage_worker_restarts_total", profile="embedded", reason="timeout")
    # When a request hangs the worker while another request waits for it
    hanging, out_h = _in_thread(server, ["HANG forever"])
    wait_for(lambda: _seen(server, "HANG forever"), timeout=60, what="the worker to take the hanging text")
    neighbour, out_n = _in_thread(server, ["a patient neighbour"])
    hanging.join()
    neighbour.join()
    # Then the hanging request fails with 503 once the micro-batch limit passed, the worker is replaced,
    # and the neighbour is answered by the new worker
    assert out_h["response"].status_code == 503, out_h["response"].text
    assert out_h["response"].json()["error"]["code"] == "worker_timeout"
    assert out_n["response"].status_code == 200
    assert (
        _metric(server, "isostage_worker_restarts_total", profile="embedded", reason="timeout")
        == restarts + 1
    )
    new_pid = next(
        w["pid"] for w in httpx.get(f"{server.url}/health").json()["workers"] if w["profile"] == "embedded"
    )
    assert new_pid not in (None, old_pid)
    wait_for(lambda: not psutil.pid_exists(old_pid), timeout=30, what="the hung worker to be gone")


def test_health_and_answers_name_the_model_not_a_path(server):
    health = httpx.get(f"{server.url}/health")
    worker = next(w for w in health.json()["workers"] if w["profile"] == "embedded")
    assert worker["model"] == NAME and "/site-packages" not in health.text and ".venv" not in health.text
    assert _post(server, ["a name please"]).json()["model"] == NAME


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    running = start_in_thread(
        Settings(server_dir=tmp_path_factory.mktemp("locked"), port=0, api_token="tok-123")
    )
    yield running
    running.stop()


def test_the_official_openai_client(server, locked):
    texts = ["The quick brown fox jumps over the lazy dog.", "Please call Stella."]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    floats = client.embeddings.create(input=texts, model="embedded", encoding_format="float")
    assert floats.model == NAME and [d.index for d in floats.data] == [0, 1]
    assert all(len(d.embedding) == 384 for d in floats.data)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(texts)
    expected = np.array([d.embedding for d in floats.data])
    # the client's default: it asks for base64 and decodes it itself
    decoded = client.embeddings.create(input=texts, model="embedded")
    np.testing.assert_allclose(np.array([d.embedding for d in decoded.data]), expected, atol=1e-6)
    packed = client.embeddings.create(input=texts, model="embedded", encoding_format="base64")
    assert all(isinstance(d.embedding, str) for d in packed.data), "base64 as asked"
    rows = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in packed.data])
    np.testing.assert_allclose(rows, expected, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(input="", model="embedded")
    assert bad.value.code == "empty_input"
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(input=["x"] * (QUEUE_BOUND + 1), model="embedded")
    assert too_many.value.code == "too_many_inputs"
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(input="x", model="no-such-model")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{locked.url}/v1", api_key="wrong", max_retries=0).embeddings.create(
            input="x", model="embedded"
        )


@pytest.mark.slow
def test_a_thousand_concurrent_connections_get_only_200_or_429_and_memory_stays_bounded(tmp_path):
    """Bounded load on loopback: 1,000 connections sending for 10 s against `bin/pipeline serve` in its own process."""
    import asyncio
    import time

    from bench.api import start_server, stop_server

    proc, url = start_server(
        tmp_path / "server",
        {
            "PIPELINE_MAX_CONCURRENT_REQUESTS": "128",
            "EMBEDDING_MAX_QUEUED_TEXTS": "256",
            "PIPELINE_DEVICE": "cpu",
        },
    )
    statuses: dict[int, int] = {}
    failures: list[str] = []
    peak = {"rss": 0, "done": False}
    warm = httpx.post(f"{url}/v1/embeddings", json={"input": "warm up", "model": "embedded"}, timeout=300)
    assert warm.status_code == 200, warm.text

    def tree_rss() -> int:
        try:
            server = psutil.Process(proc.pid)
            return sum(p.memory_info().rss for p in [server, *server.children(recursive=True)])
        except psutil.Error:
            return 0

    async def load() -> None:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        stop_at = time.monotonic() + 10

        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

            async def one(n: int) -> None:
                while time.monotonic() < stop_at:
                    try:
                        response = await client.post(
                            "/v1/embeddings",
                            json={
                                "input": [
                                    f"client {n} says the quick brown fox {i}" for i in range(1 + n % 4)
                                ],
                                "model": "embedded",
                            },
                        )
                    except httpx.HTTPError as exc:
                        failures.append(type(exc).__name__)
                        return
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code == 429:  # honoured, but not past the end of the load window
                        await asyncio.sleep(
                            min(float(response.headers["retry-after"]), max(0.0, stop_at - time.monotonic()))
                        )

            async def watch() -> None:
                while not peak["done"]:
                    peak["rss"] = max(peak["rss"], tree_rss())
                    await asyncio.sleep(0.25)

            async def clients() -> None:
                await asyncio.gather(*(one(n) for n in range(1000)))
                peak["done"] = True

            await asyncio.wait_for(asyncio.gather(watch(), clients()), timeout=55)

    try:
        asyncio.run(load())
    finally:
        stop_server(proc)
    print(f"\nstatuses {statuses}; peak RSS of the server and its worker: {peak['rss'] / 2**20:.0f} MiB")
    assert not failures, failures[:5]
    assert statuses.get(200) and set(statuses) <= {200, 429}, statuses
    assert 0 < peak["rss"] < 4 * 2**30, "the server's memory stayed bounded"


def test_a_request_that_cannot_finish_within_its_deadline_is_refused_at_once(server):
    worker = server.app.state.pool.worker("embedded")
    rate = worker.throughput
    saved = (rate.tokens_per_s, rate.tokens_per_text, rate.batch_s, rate.measured)
    # Given a busy worker, a full request queued, and a measured rate at which it takes ~50 s (deadline 60 s)
    sleeper, slept, release = _busy(server)
    filler, filled = _in_thread(server, [f"waiting text {i}" for i in range(QUEUE_BOUND - 1)])
    wait_for(lambda: _queued(server) == QUEUE_BOUND - 1 or filled, timeout=60, what="the queue to fill")
    assert not filled, filled
    rate.tokens_per_s, rate.tokens_per_text, rate.batch_s, rate.measured = 1.4, 10.0, 0.5, True
    try:
        # When one more request arrives
        t0 = time.monotonic()
        refused = _post(server, ["one text behind fifty seconds of work"])
        # Then it is refused at once (not accepted only to time out), saying when it would fit
        assert time.monotonic() - t0 < 2
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "expected_wait", refused.text
        assert int(refused.headers["retry-after"]) >= 2
    finally:
        rate.tokens_per_s, rate.tokens_per_text, rate.batch_s, rate.measured = saved
        release()
        sleeper.join()
        filler.join()
    assert slept["response"].status_code == 200 and filled["response"].status_code == 200
    assert not _seen(server, "one text behind fifty seconds of work")


def test_past_the_in_flight_limit_retry_after_is_when_the_queue_drains_not_a_fixed_second(tmp_path):
    """Before: every request past PIPELINE_MAX_CONCURRENT_REQUESTS was told 'retry in 1 s', so at 1,000
    clients they all came back each second and the refusals took the event loop (bench/api.py)."""
    record = tmp_path / "batches.jsonl"
    record.touch()
    settings = Settings(
        server_dir=tmp_path / "server",
        port=0,
        embed_max_wait_ms=20,
        max_concurrent_requests=1,
        embed_batch_timeout_s=BATCH_LIMIT_S,
        worker_start_timeout_s=120,
    )
    pool = EmbeddingPool(settings, module="tests.fixtures.worker_controlled", options={"record": str(record)})
    running = start_in_thread(settings, pool)
    running.record = record
    try:
        assert _post(running, ["warm up"]).status_code == 200
        rate = pool.worker("embedded").throughput
        # Given the one request allowed in flight, waiting in the worker, and a queue measured to drain in ~40 s
        sleeper, slept, release = _busy(running)
        rate.tokens_per_s, rate.tokens_per_text, rate.batch_s, rate.measured = 1.0, 1.0, 40.0, True
        try:
            retries = []
            for _ in range(8):
                # When more requests arrive
                refused = _post(running, ["one more"])
                assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_requests"
                retries.append(int(refused.headers["retry-after"]))
        finally:
            release()
            sleeper.join()
        # Then they are told to come back when the queue has drained, spread out, not all in 1 s
        assert all(20 <= r <= 60 for r in retries), retries
        assert len(set(retries)) > 1, retries
        assert slept["response"].status_code == 200
    finally:
        running.stop()


def test_a_request_behind_a_lagging_event_loop_is_refused_not_accepted_to_time_out(server):
    """Time spent queued behind the event loop (a burst of connections) is in no worker's estimate; the
    server measures how late its timer fires and counts that as more of the work ahead of a request. It is
    not work itself: with nothing queued or in flight, a request is admitted however late the loop runs."""
    lag = server.app.state.loop_lag
    assert lag.seconds < 5, "an idle server's loop does not lag"
    sleeper, slept, release = _busy(server)
    try:
        lag.seconds = 1e5  # as if a burst had held the loop: it fades by 10 % a tick of 0.1 s
        refused = _post(server, ["behind the burst"])
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "expected_wait", refused.text
    finally:
        release()
        sleeper.join()
    assert slept["response"].status_code == 200
    lag.seconds = 1e5
    assert _post(server, ["alone despite the lag"]).status_code == 200, "an empty queue admits anything"
    wait_for(lambda: lag.seconds < 1, timeout=60, what="the lag to fade")
    assert _post(server, ["after the burst"]).status_code == 200
    assert not _seen(server, "behind the burst")


def _slow(worker) -> None:
    """As if the worker had been measured at 1.4 tokens/s: a request of a few texts 'takes' minutes."""
    rate = worker.throughput
    rate.tokens_per_s, rate.tokens_per_text, rate.batch_s, rate.measured = 1.4, 10.0, 0.5, True
    worker.lateness.factor = 1.0


def test_sequential_requests_larger_than_their_deadline_on_an_idle_server_are_all_answered(server):
    """Nothing queued or in flight: each request is admitted, however long it is expected to take, and a
    request answered is not held against the next (each answer re-measures the rate, so it is slowed again)."""
    worker = server.app.state.pool.worker("embedded")
    lag = server.app.state.loop_lag
    texts = [f"a text of a request far larger than its deadline, number {i}" for i in range(QUEUE_BOUND)]
    saved = (worker.throughput.__dict__.copy(), worker.lateness.factor)
    statuses = []
    try:
        for _ in range(3):
            _slow(worker)
            own = worker.throughput.seconds(sum(worker.tokens(len(t)) for t in texts))
            assert own > 60, "expected to take longer than the whole deadline"
            lag.seconds = max(lag.seconds, 0.05)  # the loop of an idle server lags a little
            response = _post(server, texts)
            statuses.append((response.status_code, response.headers.get("retry-after")))
    finally:
        worker.throughput.__dict__.update(saved[0])
        worker.lateness.factor = saved[1]
    assert statuses == [(200, None)] * 3, statuses


def test_refused_requests_are_told_the_queue_ahead_and_do_not_add_to_each_other(server):
    """Retry-After is when the work queued ahead leaves room: the same request refused again and again is
    told about the same, not a later time for each refusal before it."""
    worker = server.app.state.pool.worker("embedded")
    saved = (worker.throughput.__dict__.copy(), worker.lateness.factor)
    sleeper, slept, release = _busy(server)
    filler, filled = _in_thread(server, [f"waiting text {i}" for i in range(QUEUE_BOUND - 1)])
    wait_for(lambda: _queued(server) == QUEUE_BOUND - 1 or filled, timeout=60, what="the queue to fill")
    assert not filled, filled
    _slow(worker)
    text = "a long request text, " * 10
    try:
        ahead = worker.throughput.queue_seconds(QUEUE_BOUND - 1, busy=True)
        own = worker.throughput.seconds(worker.tokens(len(text)))
        assert 0 < ahead + own - 48 < ahead and own < 48
        retries = []
        for _ in range(6):
            refused = _post(server, [text])
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "expected_wait"
            retries.append(int(refused.headers["retry-after"]))
    finally:
        worker.throughput.__dict__.update(saved[0])
        worker.lateness.factor = saved[1]
        release()
        sleeper.join()
        filler.join()
    # fits in (ahead + own - 48) s; spread over at most the queue ahead of it, never beyond
    assert all(ahead + own - 48 - 1 <= r <= 2 * ahead + own - 48 + 2 for r in retries), (retries, ahead, own)
    assert slept["response"].status_code == 200 and filled["response"].status_code == 200
    assert not _seen(server, text)


def test_langchain_openai_embeddings_with_the_documented_recipe(server):
    """docs/api.md's LangChain recipe, as written there, against the real server: its vectors are the
    official client's (documents and the query alike)."""
    from langchain_openai import OpenAIEmbeddings

    texts = ["The quick brown fox jumps over the lazy dog.", "Please call Stella."]
    embeddings = OpenAIEmbeddings(
        base_url=f"{server.url}/v1", api_key="unused", model="embedded", check_embedding_ctx_length=False
    )
    documents = np.array(embeddings.embed_documents(texts))
    query = np.array(embeddings.embed_query(texts[1]))
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    expected = np.array([d.embedding for d in client.embeddings.create(input=texts, model="embedded").data])
    assert documents.shape == (2, 384)
    np.testing.assert_allclose(documents, expected, atol=1e-6)
    np.testing.assert_allclose(query, expected[1], atol=1e-6)
