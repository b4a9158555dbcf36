"""The HTTP API against a real uvicorn server on 127.0.0.1 (ephemeral port) with real worker children."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from contracts.errors import ApiError
from orchestrator.api.client import Client
from orchestrator.api.metrics import sample
from orchestrator.api.server import start_in_thread
from orchestrator.settings import Settings
from tests.conftest import ROOT

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "Please call Stella.",
    "Ask her to bring these things with her from the store.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module: the embedded model's worker is loaded once and stays warm."""
    root = tmp_path_factory.mktemp("root")
    settings = Settings(
        server_dir=tmp_path_factory.mktemp("server"),
        port=0,
        input_roots=[root],
        embedding_profile="embedded",
        embed_max_batch=16,
        max_inputs=64,
        max_input_chars=2000,
        max_body_bytes=64 * 1024,
    )
    running = start_in_thread(settings)
    yield running
    running.stop()


@pytest.fixture()
def api(server):
    with Client(server.url) as client:
        yield client


def _post(server, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        f"{server.url}/v1/embeddings",
        content=content,
        headers={"Content-Type": "application/json", **kwargs.pop("headers", {})},
        **kwargs,
    )


# -- embeddings: shape and values -------------------------------------------------


@pytest.mark.slow
def test_embeddings_have_the_openai_shape_and_equal_in_process_encode(api, reference_model):
    response = api.embed(TEXTS, model="embedded")
    assert response.object == "list" and [d.index for d in response.data] == [0, 1, 2, 3]
    assert all(d.object == "embedding" and len(d.embedding) == 384 for d in response.data)
    assert response.model == "sentence-transformers/all-MiniLM-L6-v2", "the model actually used, by name"
    expected_tokens = sum(len(ids) for ids in reference_model.tokenizer(TEXTS)["input_ids"])
    assert response.usage.prompt_tokens == response.usage.total_tokens == expected_tokens
    expected = reference_model.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(api.vectors(response), expected, atol=1e-5)


@pytest.mark.slow
def test_a_single_string_and_base64_little_endian_float32(server, api, reference_model):
    raw = _post(server, {"input": TEXTS[0], "model": "embedded", "encoding_format": "base64"})
    assert raw.status_code == 200, raw.text
    data = raw.json()["data"]
    assert len(data) == 1 and isinstance(data[0]["embedding"], str)
    vector = np.frombuffer(base64.b64decode(data[0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(
        vector, reference_model.encode([TEXTS[0]], normalize_embeddings=True)[0], atol=1e-5
    )


@pytest.mark.slow
def test_an_unavailable_profile_falls_back_and_reports_the_model_actually_used(api, server):
    response = api.embed("hello", model="speed")  # bge-small is not available offline
    assert response.model == "sentence-transformers/all-MiniLM-L6-v2"
    speed = next(w for w in api.health().workers if w.profile == "speed")
    assert speed.running and speed.fallback_reason and "bge-small" not in response.model


@pytest.mark.slow
def test_32_concurrent_clients_are_all_right_and_share_micro_batches(server, api, reference_model):
    before = api.metrics()
    texts = [
        f"client {c} asks about item {i}: the quick brown fox number {c * 7 + i}"
        for c in range(32)
        for i in range(3)
    ]
    expected = dict(zip(texts, reference_model.encode(texts, normalize_embeddings=True)))
    errors: list[str] = []
    start = threading.Barrier(32)

    def client(c: int) -> None:
        mine = texts[c * 3 : (c + 1) * 3]
        with Client(server.url) as own:
            start.wait()
            for i in range(3):
                got = own.vectors(own.embed(mine[: i + 1], model="embedded"))
                for text, row in zip(mine, got):
                    if not np.allclose(row, expected[text], atol=1e-5):
                        errors.append(f"client {c}: wrong vector for {text!r}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    after = api.metrics()
    batches = sample(after, "isostage_embedding_batch_size_count", profile="embedded") - sample(
        before, "isostage_embedding_batch_size_count", profile="embedded"
    )
    singles = sample(after, "isostage_embedding_batch_size_bucket", profile="embedded", le="1") - sample(
        before, "isostage_embedding_batch_size_bucket", profile="embedded", le="1"
    )
    texts_done = sample(after, "isostage_embedding_texts_total", profile="embedded") - sample(
        before, "isostage_embedding_texts_total", profile="embedded"
    )
    assert texts_done == 32 * 6
    assert batches < 32 * 3, "96 requests were not batched together"
    assert batches - singles > 0, "no micro-batch held more than one text"


# -- bad requests -------------------------------------------------------------------

BAD = [
    (b'{"input": ["a", ', 400, "invalid_json"),
    ({"input": [], "model": "embedded"}, 400, "empty_input"),
    ({"input": "", "model": "embedded"}, 400, "empty_input"),
    ({"input": ["ok", ""], "model": "embedded"}, 400, "empty_input"),
    ({"input": "x", "model": "no-such-model"}, 404, "model_not_found"),
    ({"input": ["x"] * 65, "model": "embedded"}, 400, "too_many_inputs"),
    ({"input": "y" * 2001, "model": "embedded"}, 400, "input_too_long"),
    ({"input": [[1, 2, 3]], "model": "embedded"}, 400, "invalid_input"),
    ({"input": 42, "model": "embedded"}, 400, "invalid_input"),
    ({"model": "embedded"}, 400, "invalid_input"),
    ({"input": "x", "model": "embedded", "encoding_format": "int8"}, 400, "invalid_request"),
    ({"input": "x", "model": "embedded", "temperature": 1}, 400, "invalid_request"),
    (b"[]", 400, "invalid_request"),
    ({"input": ["fine", "lone \ud800 surrogate"], "model": "embedded"}, 400, "invalid_unicode"),
    (b'{"input": "\\udc80", "model": "embedded"}', 400, "invalid_unicode"),
]


@pytest.mark.parametrize("body,status,code", BAD, ids=[c for _, _, c in BAD])
def test_bad_requests_get_4xx_with_an_openai_style_error(server, body, status, code):
    response = _post(server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] and error["message"]
    assert "Traceback" not in response.text


def test_a_body_over_the_limit_is_413(server):
    response = _post(server, {"input": ["z" * 1000] * 70, "model": "embedded"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_token_arrays_are_refused_naming_the_clients_setting_that_sends_texts(server):
    # LangChain's OpenAIEmbeddings sends token ids by default (tiktoken's, not the served model's)
    response = _post(server, {"input": [[9906, 1917], [15339]], "model": "embedded"})
    assert response.status_code == 400
    assert "check_embedding_ctx_length=False" in response.json()["error"]["message"]


def test_unknown_routes_and_methods_are_openai_style_errors(server):
    assert httpx.get(f"{server.url}/v1/nothing").json()["error"]["type"] == "not_found_error"
    wrong = httpx.get(f"{server.url}/v1/embeddings")
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_health_and_metrics(server):
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    metrics = httpx.get(f"{server.url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "isostage_http_requests_total",
        "isostage_embedding_batch_size",
        "isostage_embedding_queue_length",
        "isostage_worker_restarts_total",
        "isostage_worker_oom_retries_total",
        "isostage_job_queue_length",
    ):
        assert f"# TYPE {name} " in metrics.text
    assert (
        sample(metrics.text, "isostage_http_requests_total", method="GET", route="/health", status="200") >= 1
    )


# -- models ---------------------------------------------------------------------------------


def test_the_official_client_lists_the_models_this_server_serves(server):
    """GET /v1/models in OpenAI's shape: the embedding profiles (with their models and dimensions) and the
    transcription model, without loading a model in the server."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    models = {m.id: m for m in client.models.list()}
    assert {"speed", "quality", "embedded", "whisper-1"} <= set(models)
    assert all(m.object == "model" and m.owned_by and m.created > 0 for m in models.values())
    speed, quality, embedded = models["speed"], models["quality"], models["embedded"]
    assert (speed.model_extra["model"], speed.model_extra["dimensions"]) == ("BAAI/bge-small-en-v1.5", 384)
    assert quality.model_extra["dimensions"] == 1536
    assert embedded.model_extra["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert models["whisper-1"].model_extra["kind"] == "transcriptions"
    one = client.models.retrieve("quality")
    assert one.id == "quality" and one.model_extra["model"] == "Alibaba-NLP/gte-Qwen2-1.5B-instruct"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


@pytest.mark.slow
def test_models_name_the_model_a_running_worker_runs(server, api):
    api.embed("warm", model="speed")  # offline: falls back to the embedded model
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    speed = client.models.retrieve("speed").model_extra
    running = next(w for w in api.health().workers if w.profile == "speed")
    assert speed["running_model"] == running.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert speed["running_dimensions"] == 384


# -- crash of the worker --------------------------------------------------------------


@pytest.mark.slow
def test_worker_kill_9_mid_request_the_request_is_still_answered(server, api, reference_model):
    api.embed("warm", model="embedded")
    old_pid = next(w.pid for w in api.health().workers if w.profile == "embedded")
    texts = [f"long sentence {i}: " + "the quick brown fox jumps over the lazy dog " * 12 for i in range(64)]
    before = api.metrics()
    restarts = sample(before, "isostage_worker_restarts_total", profile="embedded", reason="crash")
    embedded = sample(before, "isostage_embedding_texts_total", profile="embedded")
    answer: dict = {}

    def request() -> None:
        with Client(server.url) as own:
            answer["vectors"] = own.vectors(own.embed(texts, model="embedded"))

    thread = threading.Thread(target=request)
    thread.start()
    deadline = time.monotonic() + 30
    while (
        sample(api.metrics(), "isostage_embedding_texts_total", profile="embedded") == embedded
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    # a first micro-batch of the request is done: the next is in the worker (or about to be sent to it)
    os.kill(old_pid, signal.SIGKILL)
    thread.join(300)
    assert "vectors" in answer, "the request was not answered"
    np.testing.assert_allclose(
        answer["vectors"], reference_model.encode(texts, normalize_embeddings=True), atol=1e-5
    )
    after = api.metrics()
    assert sample(after, "isostage_worker_restarts_total", profile="embedded", reason="crash") == restarts + 1
    new_pid = next(w.pid for w in api.health().workers if w.profile == "embedded")
    assert new_pid not in (None, old_pid) and not psutil.pid_exists(old_pid)


@pytest.mark.slow
def test_a_worker_killed_while_idle_is_replaced_for_the_next_request(server, api, reference_model, caplog):
    """A worker that dies between requests (the kernel's OOM killer, an operator) is noticed when the next
    micro-batch is due: a new worker answers it, and the texts are not charged with a crash they did not
    cause (the log says so)."""
    caplog.set_level(logging.INFO, logger="orchestrator.api.workers")
    api.embed("warm", model="embedded")
    old_pid = next(w.pid for w in api.health().workers if w.profile == "embedded")
    restarts = sample(api.metrics(), "isostage_worker_restarts_total", profile="embedded", reason="crash")
    os.kill(old_pid, signal.SIGKILL)
    # the worker is a child of this process (the server runs in a thread here): wait until it can be reaped
    # (all its threads gone), without reaping it
    os.waitid(os.P_PID, old_pid, os.WEXITED | os.WNOWAIT)
    texts = ["a worker died while idle", "the next request is still answered"]
    vectors = api.vectors(api.embed(texts, model="embedded"))
    np.testing.assert_allclose(vectors, reference_model.encode(texts, normalize_embeddings=True), atol=1e-5)
    assert (
        sample(api.metrics(), "isostage_worker_restarts_total", profile="embedded", reason="crash")
        == restarts + 1
    )
    assert next(w.pid for w in api.health().workers if w.profile == "embedded") not in (None, old_pid)
    assert f"worker pid {old_pid} died while idle" in caplog.text and "died mid-batch" not in caplog.text


# -- fuzzing ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi(server):
    import schemathesis

    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_5xx(openapi, server):
    # (schemathesis' pytest plugin does not run under pytest 9 yet, so each operation's strategy is driven here)
    operations = [result.ok() for result in openapi.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} >= {
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("GET", "/health"),
    }
    seen: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            response = case.call_and_validate(base_url=server.url, checks=[not_a_server_error])
            seen.append(response.status_code)

        fuzz()
    assert seen and max(seen) < 500


# -- security -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    settings = Settings(server_dir=tmp_path_factory.mktemp("locked"), port=0, api_token="s3cret-token")
    running = start_in_thread(settings)
    yield running
    running.stop()


def test_with_a_token_every_request_but_health_needs_the_bearer(locked):
    for path in ("/metrics", "/v1/jobs/abc", "/openapi.json"):
        response = httpx.get(f"{locked.url}{path}")
        assert response.status_code == 401, path
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{locked.url}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{locked.url}/v1/embeddings", json={"input": "x"}).status_code == 401
    good = {"Authorization": "Bearer s3cret-token"}
    assert httpx.get(f"{locked.url}/metrics", headers=good).status_code == 200
    assert httpx.get(f"{locked.url}/v1/jobs/abc", headers=good).status_code == 404
    assert httpx.get(f"{locked.url}/health").status_code == 200, "/health stays open for probes"
    with pytest.raises(ApiError) as refused:
        Client(locked.url, token="nope").metrics()
    assert refused.value.status == 401
    assert "isostage_http_requests_total" in Client(locked.url, token="s3cret-token").metrics()


def test_a_non_loopback_host_without_a_token_is_refused_at_start():
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "token" in done.stderr
    assert not Settings(host="0.0.0.0").is_loopback() and Settings(host="::1").is_loopback()


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8000", "LOCALHOST:9"]
)
def test_without_a_token_loopback_host_names_are_answered(server, host):
    assert httpx.get(f"{server.url}/health", headers={"Host": host}).status_code == 200
    assert httpx.get(f"{server.url}/metrics", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
        "10.0.0.1:8000",
        "localhost.evil.example",
        "[::2]:80",
        "",
    ],
)
def test_without_a_token_other_host_names_are_403_dns_rebinding(server, host):
    for method, path in (("GET", "/health"), ("GET", "/metrics"), ("POST", "/v1/embeddings")):
        response = httpx.request(method, f"{server.url}{path}", headers={"Host": host}, json={"input": "x"})
        assert response.status_code == 403, (host, path)
        assert response.json()["error"]["code"] == "host_not_allowed"


def test_with_a_token_any_host_name_is_answered_with_the_token(locked):
    good = {"Authorization": "Bearer s3cret-token", "Host": "api.example.org"}
    assert httpx.get(f"{locked.url}/metrics", headers=good).status_code == 200


def test_health_without_the_token_is_status_only_detail_with_it(locked):
    good = {"Authorization": "Bearer s3cret-token"}
    bare = httpx.get(f"{locked.url}/health")
    wrong = httpx.get(f"{locked.url}/health", headers={"Authorization": "Bearer nope"})
    for response in (bare, wrong):
        assert response.status_code == 200 and response.json() == {"status": "ok"}, response.text
        assert "pid" not in response.text and "/" not in response.text
    detail = httpx.get(f"{locked.url}/health", headers=good).json()
    assert detail["status"] == "ok" and detail["workers"] == [] and detail["jobs_queued"] == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_reads_the_token_from_a_file_not_the_command_line(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-123\n")
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(ROOT / "bin" / "pipeline"),
            "serve",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--server-dir",
            str(tmp_path / "server"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(f"{url}/health").status_code == 200
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
                return False

        from tests.conftest import wait_for

        wait_for(up, timeout=120, what="the server")
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert (
            httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer from-a-file-123"}).status_code
            == 200
        )
        assert "from-a-file-123" not in " ".join(psutil.Process(proc.pid).cmdline())
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_server_runs_on_uvloop_and_httptools_unless_told_otherwise():
    """The project installs what uvicorn[standard] adds and uvicorn takes them; PIPELINE_API_LOOP=asyncio and
    PIPELINE_API_HTTP=h11 give the pure-Python ones back."""
    from fastapi import FastAPI
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from orchestrator.api.server import uvicorn_config
    from orchestrator.settings import Settings

    default = uvicorn_config(FastAPI(), Settings())
    default.load()
    assert default.timeout_keep_alive == 75, "a refused client sleeping its Retry-After keeps its connection"
    assert default.http_protocol_class is HttpToolsProtocol
    assert default.get_loop_factory().__module__.startswith("uvloop")
    plain = uvicorn_config(FastAPI(), Settings(api_loop="asyncio", api_http="h11"))
    plain.load()
    assert plain.http_protocol_class is H11Protocol and plain.get_loop_factory().__module__.startswith(
        "asyncio"
    )
