"""What every request passes before a route sees it: its API key and its size.

``Guards`` is ASGI middleware around the application:

- with keys set (``--api-key``, ``--api-key-file``), every route but ``/health`` and the web
  page's own files needs ``Authorization: Bearer KEY`` or ``x-api-key: KEY``; a missing or
  wrong one is answered 401 in the route's dialect (OpenAI's ``invalid_api_key``, Anthropic's
  ``authentication_error``, Ollama's ``{"error": ...}`` on ``/api/``). Keys are compared in
  constant time (``hmac.compare_digest``, each key tried whatever the outcome of the others)
  and never written anywhere;
- a body over ``max_body`` bytes is answered 413 without being read whole: at once when its
  ``Content-Length`` says so, else as soon as what arrived passes the limit (the handler's
  read of the body raises ``BodyTooLargeError``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from bmoe.serve.errors import INVALID_REQUEST, ApiError, BodyTooLargeError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MIB = 1 << 20
MIN_BODY_BYTES = 8 * MIB
BODY_BYTES_PER_CONTEXT_TOKEN = 32
OPEN_PATHS = frozenset({"/health", "/", "/favicon.ico"})
OPEN_PREFIXES = ("/web/",)


def default_max_body(n_ctx: int) -> int:
    """The body limit a context of ``n_ctx`` tokens gets: 32 bytes a token (a prompt that
    fills the context, JSON-escaped), at least 8 MiB."""
    return max(MIN_BODY_BYTES, n_ctx * BODY_BYTES_PER_CONTEXT_TOKEN)


def dialect_of(path: str) -> str:
    """Whose error shape a path answers in."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") else "openai"


def key_matches(given: str, keys: Sequence[str]) -> bool:
    """Whether ``given`` is one of ``keys``, each compared in constant time."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given.encode(), key.encode())
    return found


def presented_keys(headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """The keys a request presents: ``Authorization: Bearer KEY``, ``x-api-key: KEY``."""
    keys = []
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"x-api-key":
            keys.append(value.decode("latin-1").strip())
        elif lowered == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                keys.append(key.strip())
    return keys


async def _answer(send: Send, err: ApiError, path: str) -> None:
    body = err.body_for(dialect_of(path))
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if err.status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class Guards:
    """ASGI middleware: the key check and the body limit (see the module's docstring)."""

    def __init__(self, app: App, *, api_keys: Sequence[str] = (), max_body: int = MIN_BODY_BYTES) -> None:
        if any(not key for key in api_keys):
            raise ValueError("an API key must not be empty")
        self.app = app
        self.api_keys = tuple(api_keys)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        headers = scope.get("headers", [])
        if self.api_keys and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            presented = presented_keys(headers)
            if not any([key_matches(key, self.api_keys) for key in presented]):  # each one tried
                message = "a valid API key is needed (Authorization: Bearer KEY or x-api-key: KEY)"
                await _answer(send, ApiError(401, message, INVALID_REQUEST, None, "invalid_api_key"), path)
                return
        length = next((v for k, v in headers if k.lower() == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_body:
            exc = BodyTooLargeError(self.max_body)
            await _answer(send, ApiError(413, str(exc), INVALID_REQUEST, None, exc.code), path)
            return
        await self.app(scope, self._bounded(receive), send)

    def _bounded(self, receive: Receive) -> Receive:
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLargeError(self.max_body)
            return message

        return bounded
