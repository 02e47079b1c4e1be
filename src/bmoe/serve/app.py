"""The HTTP side: Starlette routes over a ``ServedSession``.

- ``GET /v1/models``, ``GET /v1/models/{id}``;
- ``POST /v1/chat/completions`` and ``POST /v1/completions``, answered whole or, with
  ``"stream": true``, as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``);
- ``POST /v1/decide``: bmoe's decisions;
- ``GET /`` (the web page), ``GET /v1/bmoe/metrics`` (the live engine feed): ``page``.

Each request's work is queued on the session's worker; the handler waits for it without
blocking the event loop. A client that goes away cancels its request (queued or running).
A streamed request starts its stream once the first piece is out (or the request
finished), so a request the session refuses (a prompt past the context) is still answered
with its HTTP status; an error after that ends the stream with an ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bmoe.serve import api_responses as api
from bmoe.serve.api_requests import Generation, parse_chat_completion, parse_completion, parse_decide
from bmoe.serve.api_responses import Delta, Envelope, Json, Outcome
from bmoe.serve.errors import INVALID_REQUEST, ApiError, RequestError, api_error
from bmoe.serve.fields import body_object
from bmoe.serve.page import page_routes
from bmoe.serve.service import ServedSession, new_id
from bmoe.serve.worker import Job

T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Response]]


class _Done:
    """The end of a job's pieces."""


DONE = _Done()


def _json_response(body: Json, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def error_response(exc: BaseException) -> JSONResponse:
    """``exc`` in OpenAI's error shape, with its status (Starlette's 404 and 405 too)."""
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        err = ApiError(exc.status_code, exc.detail, INVALID_REQUEST, None, code)
    else:
        err = api_error(exc)
    return _json_response(err.body(), err.status)


def _dumps(body: Json | str) -> str:
    return body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))


class _Pieces:
    """A job's streamed pieces, carried from the worker's thread to the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Delta | _Done] = asyncio.Queue()

    def emit(self, item: Delta | _Done) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone, nobody reads
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def follow(self, future: Future[Any]) -> None:
        """End the pieces when ``future`` settles (after every piece it emitted)."""
        future.add_done_callback(lambda _: self.emit(DONE))


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _or_disconnect(request: Request, job: Job[Any], awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; cancel ``job`` if the client goes away meanwhile."""

    async def watch() -> None:
        await _until_disconnect(request)
        job.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await awaitable
    finally:
        watcher.cancel()


async def _body(request: Request) -> Json:
    raw = await request.body()
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    return dict(body_object(value))


def _openai_errors(handler: Handler) -> Handler:
    """Answer whatever ``handler`` raises in OpenAI's error shape."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return error_response(exc)

    return wrapped


def build_app(served: ServedSession) -> Starlette:
    """The ASGI application serving ``served``."""

    def envelope(prefix: str) -> Envelope:
        return Envelope(id=new_id(prefix), created=int(time.time()), model=served.model_id)

    async def models(_: Request) -> Response:
        return _json_response(api.model_list(served.card))

    async def model(request: Request) -> Response:
        if request.path_params["model"] != served.model_id:
            raise HTTPException(404, f"the model '{request.path_params['model']}' does not exist")
        return _json_response(served.card.body())

    async def chat_completions(request: Request) -> Response:
        asked = parse_chat_completion(await _body(request))
        pieces = _Pieces()
        job = served.chat(asked, pieces.emit)
        return await _answer(request, job, pieces, asked.generation, envelope("chatcmpl"), chat=True)

    async def completions(request: Request) -> Response:
        asked = parse_completion(await _body(request))
        pieces = _Pieces()
        job = served.complete(asked, pieces.emit)
        return await _answer(request, job, pieces, asked.generation, envelope("cmpl"), chat=False)

    async def decide(request: Request) -> Response:
        asked = parse_decide(await _body(request))
        job = served.decide(asked)
        try:
            result = await _or_disconnect(request, job, asyncio.wrap_future(job.future))
        finally:
            job.cancel()
        return _json_response(api.decision(envelope("decision"), asked, result))

    async def http_error(_: Request, exc: Exception) -> Response:
        return error_response(exc)

    routes = [
        Route("/v1/models", _openai_errors(models), methods=["GET"]),
        Route("/v1/models/{model:path}", _openai_errors(model), methods=["GET"]),
        Route("/v1/chat/completions", _openai_errors(chat_completions), methods=["POST"]),
        Route("/v1/completions", _openai_errors(completions), methods=["POST"]),
        Route("/v1/decide", _openai_errors(decide), methods=["POST"]),
        *page_routes(served),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def _answer(
    request: Request, job: Job[Outcome], pieces: _Pieces, gen: Generation, env: Envelope, *, chat: bool
) -> Response:
    pieces.follow(job.future)
    if not gen.stream:
        try:
            result = await _or_disconnect(request, job, asyncio.wrap_future(job.future))
        finally:
            job.cancel()
        return _json_response(api.chat_completion(env, result) if chat else api.text_completion(env, result))
    try:
        first = await _or_disconnect(request, job, pieces.queue.get())
        if isinstance(first, _Done):
            job.future.result()  # raises the request's error, answered with its status
    except BaseException:
        job.cancel()
        raise
    events = (_chat_events if chat else _text_events)(first, pieces, job, env, gen)
    return EventSourceResponse(events, sep="\n")


async def _pieces_then_outcome(
    first: Delta | _Done, pieces: _Pieces, job: Job[Outcome]
) -> AsyncIterator[Delta | Outcome | BaseException]:
    """The job's pieces, then its outcome (or its error)."""
    item = first
    while isinstance(item, Delta):
        yield item
        item = await pieces.queue.get()
    error = job.future.exception()
    yield error if error is not None else job.future.result()


def _event(body: Json | str) -> ServerSentEvent:
    return ServerSentEvent(data=_dumps(body))


async def _chat_events(
    first: Delta | _Done, pieces: _Pieces, job: Job[Outcome], env: Envelope, gen: Generation
) -> AsyncIterator[ServerSentEvent]:
    calls = 0
    try:
        yield _event(api.chat_chunk(env, {"role": "assistant", "content": ""}))
        async for item in _pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                logprobs = api.chat_logprobs(item.logprobs) if gen.logprobs is not None else None
                yield _event(api.chat_chunk(env, api.chat_delta(item, calls), None, logprobs))
                calls += len(item.tool_calls)
            elif isinstance(item, Outcome):
                yield _event(api.chat_chunk(env, {}, item.finish_reason))
                if gen.include_usage:
                    yield _event(api.usage_chunk(env, "chat.completion.chunk", item))
            else:
                yield _event(api_error(item).body())
        yield _event("[DONE]")
    finally:
        job.cancel()  # the stream closed early: the client went away


async def _text_events(
    first: Delta | _Done, pieces: _Pieces, job: Job[Outcome], env: Envelope, gen: Generation
) -> AsyncIterator[ServerSentEvent]:
    offset = 0
    try:
        async for item in _pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                logprobs = api.text_logprobs(item.logprobs, offset) if gen.logprobs is not None else None
                yield _event(api.text_chunk(env, item, None, logprobs))
                offset += sum(len(lp.chosen.piece) for lp in item.logprobs)
            elif isinstance(item, Outcome):
                yield _event(api.text_chunk(env, Delta(), item.finish_reason))
                if gen.include_usage:
                    yield _event(api.usage_chunk(env, "text_completion", item))
            else:
                yield _event(api_error(item).body())
        yield _event("[DONE]")
    finally:
        job.cancel()  # the stream closed early: the client went away
