"""The API's ASGI guard: what every request goes through before a route sees it.

Host check (a loopback server without a token answers loopback names only), bearer token, the in-flight
limit (429 with a Retry-After from the queue's drain time), the body limit (413; uploads to
``/v1/audio/transcriptions`` admitted by expected wait first, then streamed to the form parser whatever
their transfer encoding), and the request metrics.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import random
import time
from collections.abc import Callable

from fastapi.security.utils import get_authorization_scheme_param

from contracts.errors import ApiError
from orchestrator.api.admission import drain_retry
from orchestrator.api.errors import error_response
from orchestrator.api.metrics import Metrics
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: the route whose uploads the guard admits by expected wait and streams instead of buffering
TRANSCRIPTIONS = "/v1/audio/transcriptions"
#: the key in a request's ``scope["state"]`` of its admitted upload's reservation: the function that stops
#: counting the upload as work ahead (the route calls it once the job is queued, the guard at the end)
UPLOAD_RESERVED = "upload_reserved"
#: the routes named in the request metrics (anything else is "other")
ROUTES = ("/v1/embeddings", "/v1/jobs", TRANSCRIPTIONS, "/health", "/metrics", "/openapi.json", "/docs")
#: room for the multipart framing and the form's other fields around an upload
FORM_OVERHEAD = 64 * 1024
#: paths answered without a token (liveness probes: status only, the detail needs the token)
OPEN_PATHS = frozenset({"/health"})
#: Host names a loopback server without a token answers (anything else may be DNS rebinding from a browser)
LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8000`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_loopback_host(header: str) -> bool:
    name = host_name(header).rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def route_of(path: str) -> str:
    """A bounded label for metrics: the route template, not the raw path."""
    if path.startswith("/v1/jobs/"):
        return "/v1/jobs/{id}/result" if path.endswith("/result") else "/v1/jobs/{id}"
    return path if path in ROUTES else "other"


class Guard:
    """ASGI middleware: Host check, bearer token, concurrency limit, request body limit, request metrics.

    Without a token on a loopback address, only Host headers naming loopback are answered (403
    otherwise): a web page the user visits cannot reach the API through DNS rebinding. Requests beyond
    ``max_concurrent_requests`` in flight are answered 429 before their body is read. Whether the
    request carried the token is left in ``scope["state"]["authorized"]`` (``/health`` shows its
    detail only then).

    The token is checked here rather than with a route dependency (``fastapi.security.HTTPBearer``)
    because it must also cover ``/openapi.json``, ``/docs`` and unknown paths, and come before the
    body is read (so an unauthenticated client cannot make the server buffer a large body); the
    header is parsed with FastAPI's own helper.
    """

    def __init__(
        self,
        app,
        settings: Settings,
        metrics: Metrics,
        admit_upload: Callable[[dict], ApiError | None] | None = None,
        drain_s: Callable[[], float] | None = None,
    ) -> None:
        self.app = app
        self.upload_limit = settings.max_upload_bytes + FORM_OVERHEAD
        self.max_upload = settings.max_upload_bytes
        #: transcriptions are admitted (or refused, 429) before their upload is read; an admitted one
        #: leaves in the request's state the function that ends its reservation (called here at the end)
        self.admit_upload = admit_upload
        token = settings.api_token.get_secret_value() if settings.api_token else ""
        self.expected = token.encode() if token else None
        self.max_body = settings.max_body_bytes
        self.metrics = metrics
        self.check_host = self.expected is None and settings.is_loopback()
        self.max_in_flight = settings.max_concurrent_requests
        self.retry_after = str(settings.retry_after_s)
        self.floor_s = settings.retry_after_s
        #: seconds until the queued work is done: the in-flight limit's Retry-After (not a fixed second,
        #: which brings every refused client back at once: a retry storm that takes the event loop)
        self.drain_s = drain_s
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_seen = {"status": 500}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status_seen["status"] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(
                route=route_of(scope["path"]), method=scope["method"], status=str(status_seen["status"])
            ).inc()

    async def _guarded(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        if self.check_host and not is_loopback_host(headers.get(b"host", b"").decode("latin-1")):
            log.warning(
                "refused a request with Host %r: this server without a token answers loopback names only",
                headers.get(b"host", b"").decode("latin-1")[:100],
            )
            await error_response(
                403,
                "this server answers only Host headers naming loopback (localhost, 127.0.0.1, [::1]) "
                "unless it has a token",
                type="permission_error",
                code="host_not_allowed",
                headers={"Connection": "close"},
            )(scope, receive, send)
            return
        authorized = self.expected is None
        if not authorized:
            scheme, given = get_authorization_scheme_param(
                headers.get(b"authorization", b"").decode("latin-1")
            )
            authorized = scheme.lower() == "bearer" and hmac.compare_digest(
                given.encode("latin-1"), self.expected
            )
        if not authorized and scope["path"] not in OPEN_PATHS:
            await error_response(
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )(scope, receive, send)
            return
        scope.setdefault("state", {})["authorized"] = authorized
        scope["state"]["arrived"] = time.monotonic()
        if scope["path"] in OPEN_PATHS:
            await self._body(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejected.labels(reason="concurrency").inc()
            retry = drain_retry(self.drain_s() if self.drain_s else 0.0, self.floor_s, random.random())
            await error_response(
                429,
                f"too many requests in flight (more than {self.max_in_flight}); retry in {retry}s",
                code="too_many_requests",
                headers={"Retry-After": str(retry)},
            )(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self._body(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _body(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        upload = scope["path"] == TRANSCRIPTIONS and scope["method"] == "POST"
        limit = self.upload_limit if upload else self.max_body
        # what the refusal names is the limit the user set (an upload's form adds its own bytes to it)
        too_large = (
            f"the upload is larger than {self.max_upload} bytes (PIPELINE_MAX_UPLOAD_BYTES)"
            if upload
            else f"request body larger than {self.max_body} bytes (PIPELINE_MAX_BODY_BYTES)"
        )
        if upload and self.admit_upload is not None:
            state = scope.setdefault("state", {})
            refused = self.admit_upload(state)
            if refused is not None:
                self.metrics.rejected.labels(reason="expected_wait").inc()
                await error_response(
                    429,
                    refused.message,
                    code=refused.code,
                    headers={
                        "Retry-After": str(refused.retry_after or self.retry_after),
                        "Connection": "close",
                    },
                )(scope, receive, send)
                return
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._too_large(scope, receive, send, too_large)
            return
        # streamed to the form parser (it spools to disk), never held whole, with or without a length
        if upload:
            try:
                await self.app(scope, _bounded(receive, declared, limit, too_large), send)
            finally:
                release = scope.get("state", {}).get(UPLOAD_RESERVED)
                if release is not None:
                    release()  # an upload given up before it was queued no longer counts as work ahead
            return
        body, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(scope, receive, send, too_large)
                return
            body.append(chunk)
            more = message.get("more_body", False)
        whole = b"".join(body)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send, message: str) -> None:
        await error_response(413, message, code="body_too_large", headers={"Connection": "close"})(
            scope, receive, send
        )


def _bounded(receive, declared: bytes | None, limit: int, refusal: str):
    """``receive`` that ends the request (a disconnect) when more than the ``declared`` length arrives,
    and raises a 413 :class:`ApiError` saying ``refusal`` when a body without a declared length grows past
    ``limit``."""
    seen = 0

    async def bounded():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if declared is not None and seen > int(declared):
                return {"type": "http.disconnect"}
            if seen > limit:
                raise ApiError(413, refusal, type="request_too_large", code="body_too_large")
        return message

    return bounded
