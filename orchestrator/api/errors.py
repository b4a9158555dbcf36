"""OpenAI-style error answers: ``{"error": {"message", "type", "param", "code"}}``, never a stack trace.

Shared by the routes' exception handlers (``orchestrator.api.server``) and the ASGI guard, which answers
before any route runs (``orchestrator.api.guard``).
"""

from __future__ import annotations

from fastapi.responses import Response

from contracts.api import ErrorDetail, ErrorResponse

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    504: "timeout_error",
}


def error_body(
    status: int, message: str, type: str | None = None, param: str | None = None, code: str | None = None
) -> bytes:
    detail = ErrorDetail(
        message=message, type=type or TYPES.get(status, "server_error"), param=param, code=code
    )
    return ErrorResponse(error=detail).model_dump_json().encode()


def error_response(
    status: int,
    message: str,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        error_body(status, message, type, param, code),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
