"""The ASGI guard without a server: Host names, route labels, and the guard driven by hand-made ASGI
messages around a stub app (the same rules over real HTTP: test_server.py, test_load.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from contracts.errors import ApiError
from orchestrator.api.guard import TRANSCRIPTIONS, Guard, host_name, is_loopback_host, route_of
from orchestrator.api.metrics import Metrics
from orchestrator.settings import Settings


@pytest.mark.parametrize(
    "header,name",
    [
        ("localhost:8000", "localhost"),
        ("LOCALHOST", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("  example.com  ", "example.com"),
    ],
)
def test_the_name_of_a_host_header(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    "header", ["localhost", "localhost.:8000", "127.0.0.1:8000", "127.8.9.1", "[::1]:80"]
)
def test_loopback_host_headers(header):
    assert is_loopback_host(header)


@pytest.mark.parametrize(
    "header", ["", "example.com", "localhost.example.com", "10.0.0.1:8000", "[::2]", "0.0.0.0", "[::1"]
)
def test_other_host_headers_are_not_loopback(header):
    assert not is_loopback_host(header)


def test_metrics_name_route_templates_never_raw_paths():
    assert route_of("/v1/embeddings") == "/v1/embeddings"
    assert route_of("/v1/jobs/0123abcd") == "/v1/jobs/{id}"
    assert route_of("/v1/jobs/0123abcd/result") == "/v1/jobs/{id}/result"
    assert route_of(TRANSCRIPTIONS) == TRANSCRIPTIONS
    assert route_of("/wp-admin/secret.php") == "other"


# -- the guard as ASGI middleware ------------------------------------------------------


class Stub:
    """An app that reads the whole body and answers 200 with what it saw; with ``release`` set to an event,
    requests but /health wait for it."""

    def __init__(self) -> None:
        self.calls = 0
        self.release: asyncio.Event | None = None

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        if self.release is not None and scope["path"] != "/health":
            await self.release.wait()
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        state = scope.get("state", {})
        answer = json.dumps({"size": len(body), "authorized": state.get("authorized")}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})


async def _request(guard, path="/v1/embeddings", headers=None, chunks=(b"",), method="POST"):
    """(status, headers, body) of one request through ``guard``."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [
            (k.lower().encode(), v.encode()) for k, v in {"Host": "localhost", **(headers or {})}.items()
        ],
    }
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    await guard(scope, receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    if start is None:
        return None, {}, b""
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


def _guard(app=None, **settings):
    metrics = Metrics()
    extra = {k: settings.pop(k) for k in ("admit_upload", "drain_s") if k in settings}
    return Guard(app or Stub(), Settings(**settings), metrics, **extra), metrics


def test_without_a_token_only_loopback_host_names_are_answered():
    guard, metrics = _guard()
    status, headers, body = asyncio.run(_request(guard, headers={"Host": "evil.example:8000"}))
    assert status == 403 and json.loads(body)["error"]["code"] == "host_not_allowed"
    assert headers["connection"] == "close" and guard.app.calls == 0
    status, _, body = asyncio.run(_request(guard, headers={"Host": "localhost:8000"}, chunks=[b"ab", b"cd"]))
    assert status == 200 and json.loads(body) == {"size": 4, "authorized": True}, "the body replayed whole"
    assert (
        metrics.value("isostage_http_requests_total", route="/v1/embeddings", method="POST", status="403")
        == 1
    )
    assert (
        metrics.value("isostage_http_requests_total", route="/v1/embeddings", method="POST", status="200")
        == 1
    )


def test_with_a_token_every_path_but_health_needs_it_and_any_host_is_answered():
    guard, _ = _guard(api_token="s3cret")
    status, headers, body = asyncio.run(_request(guard, headers={"Host": "evil.example"}))
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    wrong = asyncio.run(_request(guard, path="/docs", method="GET", headers={"Authorization": "Bearer nope"}))
    assert wrong[0] == 401
    status, _, body = asyncio.run(
        _request(guard, headers={"Host": "evil.example", "Authorization": "bearer s3cret"})
    )
    assert status == 200 and json.loads(body)["authorized"] is True
    status, _, body = asyncio.run(_request(guard, path="/health", method="GET"))
    assert status == 200 and json.loads(body)["authorized"] is False, "open, but without its detail"


def test_a_body_over_the_limit_is_413_declared_or_streamed():
    guard, _ = _guard(max_body_bytes=1024)
    status, headers, body = asyncio.run(_request(guard, headers={"Content-Length": "4096"}))
    assert status == 413 and headers["connection"] == "close" and guard.app.calls == 0, (
        "refused before reading"
    )
    assert asyncio.run(_request(guard, headers={"Content-Length": "12x"}))[0] == 413
    status, _, body = asyncio.run(_request(guard, chunks=[b"x" * 600, b"x" * 600]))
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large" and guard.app.calls == 0


def test_the_413_names_the_limit_the_user_set_for_an_upload_and_for_a_body():
    # Given uploads limited to 200,000 bytes (the form around the file may add its own bytes to that)
    guard, _ = _guard(max_upload_bytes=200_000, max_body_bytes=4096)
    status, _, body = asyncio.run(_request(guard, path=TRANSCRIPTIONS, headers={"Content-Length": "900000"}))
    message = json.loads(body)["error"]["message"]
    # Then the refusal names 200,000 and its setting, not the limit with the form's allowance added
    assert status == 413 and "200000 bytes (PIPELINE_MAX_UPLOAD_BYTES)" in message, message
    status, _, body = asyncio.run(_request(guard, headers={"Content-Length": "9000"}))
    assert status == 413 and "4096 bytes (PIPELINE_MAX_BODY_BYTES)" in json.loads(body)["error"]["message"]


def test_past_the_in_flight_limit_429_with_a_retry_after_from_the_drain_time():
    async def scenario():
        app = Stub()
        app.release = asyncio.Event()
        guard, metrics = _guard(app, max_concurrent_requests=1, drain_s=lambda: 20.0)
        first = asyncio.ensure_future(_request(guard))
        await asyncio.sleep(0)
        assert guard.in_flight == 1
        status, headers, body = await _request(guard)
        health = await _request(guard, path="/health", method="GET")
        app.release.set()
        assert (await first)[0] == 200 and guard.in_flight == 0
        return status, headers, body, health, metrics

    status, headers, body, health, metrics = asyncio.run(scenario())
    assert status == 429 and json.loads(body)["error"]["code"] == "too_many_requests"
    assert 10 <= int(headers["retry-after"]) <= 30, "half to one and a half the queue's drain time"
    assert health[0] == 200, "liveness probes are not counted against the limit"
    assert metrics.value("isostage_rejected_requests_total", reason="concurrency") == 1


def test_an_upload_refused_by_expected_wait_is_answered_before_its_body_is_read():
    refused = ApiError(429, "the queue would not answer in time", code="expected_wait", retry_after=7)
    guard, metrics = _guard(admit_upload=lambda state: refused)
    status, headers, body = asyncio.run(
        _request(guard, path=TRANSCRIPTIONS, headers={"Content-Length": "10"})
    )
    assert status == 429 and headers["retry-after"] == "7" and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "expected_wait" and guard.app.calls == 0
    assert metrics.value("isostage_rejected_requests_total", reason="expected_wait") == 1


def test_an_admitted_upload_is_streamed_and_ends_where_its_declared_length_does():
    guard, _ = _guard(admit_upload=lambda state: None, max_body_bytes=1024)
    # beyond the JSON body limit but within the upload limit: streamed through, not buffered
    status, _, body = asyncio.run(
        _request(
            guard, path=TRANSCRIPTIONS, headers={"Content-Length": "2048"}, chunks=[b"a" * 1024, b"b" * 1024]
        )
    )
    assert status == 200 and json.loads(body)["size"] == 2048
    # a client sending more than it declared is cut off: the app sees a disconnect, not the extra bytes
    status, _, _ = asyncio.run(
        _request(
            guard, path=TRANSCRIPTIONS, headers={"Content-Length": "1500"}, chunks=[b"a" * 1024, b"b" * 1024]
        )
    )
    assert status is None and guard.app.calls == 2
