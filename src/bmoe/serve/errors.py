"""Errors of the server, and every error as an HTTP status with OpenAI's error body (or
Anthropic's, on the Messages API's routes, or Ollama's, on its ``/api/`` routes).

OpenAI's shape: ``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``;
Anthropic's: ``{"type": "error", "error": {"type": ..., "message": ...}}``; Ollama's:
``{"error": "..."}``.
What went wrong decides the status: the request (400: a bad request, a prompt past the
context, a refused decision), this request's computation (500: llama.cpp failed a decode;
the session is then over), or the service (503: the session ended after a fatal error, an
expert read failed, the server is shutting down or the request was cancelled).
"""

from __future__ import annotations

from typing import Any

import attrs

from bmoe.errors import (
    BmoeError,
    ChoiceError,
    ConfigError,
    ContextOverflowError,
    DecideDisabledError,
    GrammarError,
    RequestError,
    SessionFailedError,
    StreamingFaultError,
    ToolFormatError,
)


class BodyTooLargeError(RequestError):
    """A request body past the server's ``--max-body-mb`` (HTTP 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than this server takes ({limit} bytes; --max-body-mb)",
            None,
            "request_too_large",
        )


class NotFoundError(RequestError):
    """A stored object (a response id) the server does not hold (HTTP 404)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param, "not_found")


class NotServedError(RequestError):
    """An endpoint this server does not serve (Ollama's model management: pull, push,
    create, copy, delete, blobs; embeddings), HTTP 501."""

    def __init__(self, message: str) -> None:
        super().__init__(message, None, "not_implemented")


class RequestCancelledError(BmoeError):
    """The request was cancelled before it finished: its client went away, or the server
    is shutting down."""


class ServerClosedError(BmoeError):
    """The server is shutting down and takes no more requests."""


@attrs.frozen
class ApiError:
    """One error as the server answers it: the HTTP ``status`` and OpenAI's fields."""

    status: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """``{"type": "error", "error": {"type", "message"}}``, the type from the status."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else INVALID_REQUEST)
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def ollama_body(self) -> dict[str, Any]:
        """``{"error": "..."}``, Ollama's shape."""
        return {"error": self.message}

    def body_for(self, dialect: str) -> dict[str, Any]:
        """The body in ``dialect``'s shape (``openai``, ``anthropic`` or ``ollama``)."""
        if dialect == "anthropic":
            return self.anthropic_body()
        return self.ollama_body() if dialect == "ollama" else self.body()


INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
ANTHROPIC_TYPES = {
    400: INVALID_REQUEST,
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
}


def api_error(exc: BaseException) -> ApiError:
    """``exc`` as the server answers it (anything that is not bmoe's is a 500)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, BodyTooLargeError):
        return ApiError(413, message, INVALID_REQUEST, None, exc.code)
    if isinstance(exc, NotServedError):
        return ApiError(501, message, INVALID_REQUEST, None, exc.code)
    if isinstance(exc, NotFoundError):
        return ApiError(404, message, INVALID_REQUEST, exc.param, exc.code)
    if isinstance(exc, RequestError):
        return ApiError(400, message, INVALID_REQUEST, exc.param, exc.code)
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, message, INVALID_REQUEST, "messages", "context_length_exceeded")
    if isinstance(exc, DecideDisabledError):
        message = f"{message} (start the server with --decide)"
        return ApiError(400, message, INVALID_REQUEST, None, "decide_disabled")
    if isinstance(exc, ChoiceError):
        return ApiError(400, message, INVALID_REQUEST, "choices", "invalid_choices")
    if isinstance(exc, GrammarError):
        return ApiError(400, message, INVALID_REQUEST, exc.where, "invalid_grammar")
    if isinstance(exc, ToolFormatError):
        return ApiError(400, message, INVALID_REQUEST, "tools", "unsupported_tool_format")
    if isinstance(exc, ConfigError):
        return ApiError(400, message, INVALID_REQUEST, exc.where, "invalid_value")
    if isinstance(exc, SessionFailedError | StreamingFaultError | ServerClosedError | RequestCancelledError):
        return ApiError(503, message, SERVER_ERROR, None, "session_unavailable")
    if isinstance(exc, BmoeError):
        return ApiError(500, message, SERVER_ERROR, None, "session_failed")
    return ApiError(500, f"internal error: {message}", SERVER_ERROR)
