"""What every route's handler shares: a JSON body read, a job awaited or streamed, an error
answered in the route's dialect.

A job's streamed pieces (``Delta`` values, emitted on the worker's thread) are carried to
the event loop by ``Pieces``; ``first_piece`` waits for the first of them (or the end), so a
request the session refuses is still answered with its HTTP status, before any stream
starts; ``pieces_then_outcome`` then yields the rest and the ``Outcome`` (or the error). A
client that goes away meanwhile cancels the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bmoe.errors import RequestError
from bmoe.requests.fields import body_object
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import INVALID_REQUEST, ApiError, api_error
from bmoe.serve.worker import Job

T = TypeVar("T")
Json = dict[str, Any]
Handler = Callable[[Request], Awaitable[Response]]
Dialect = Literal["openai", "anthropic", "ollama"]


class Done:
    """The end of a job's pieces."""


DONE = Done()


def json_response(body: Json | list[Any], status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def dumps(body: Json | str) -> str:
    """One line of JSON (a string as it is: ``[DONE]``)."""
    return body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def as_api_error(exc: BaseException) -> ApiError:
    """``exc`` as the server answers it (Starlette's 404 and 405 too)."""
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return ApiError(exc.status_code, exc.detail, INVALID_REQUEST, None, code)
    return api_error(exc)


def error_response(exc: BaseException, dialect: Dialect = "openai") -> JSONResponse:
    """``exc`` in the dialect's error shape, with its status."""
    err = as_api_error(exc)
    return json_response(err.body_for(dialect), err.status)


def answering_errors(handler: Handler, dialect: Dialect = "openai") -> Handler:
    """Answer whatever ``handler`` raises in the dialect's error shape."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return error_response(exc, dialect)

    return wrapped


async def off_loop_if(blocking: bool, call: Callable[[], T]) -> T:
    """``call()``: on a worker thread where it may block (a request whose images are
    fetched or read: ``MediaPolicy.reaches_out``), else here."""
    return await asyncio.to_thread(call) if blocking else call()


async def read_json_body(request: Request) -> Json:
    """The request's body: a JSON object (``RequestError`` when it is not one)."""
    raw = await request.body()
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    return dict(body_object(value))


class Pieces:
    """A job's streamed pieces, carried from the worker's thread to the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Delta | Done] = asyncio.Queue()

    def emit(self, item: Delta | Done) -> None:
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


async def or_disconnect(request: Request, job: Job[Any], awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; cancel ``job`` if the client goes away meanwhile."""

    async def watch() -> None:
        await _until_disconnect(request)
        job.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await awaitable
    finally:
        watcher.cancel()


async def job_result(request: Request, job: Job[T]) -> T:
    """What ``job`` returns (or raises); cancelled if the client goes away first."""
    try:
        return await or_disconnect(request, job, asyncio.wrap_future(job.future))
    finally:
        job.cancel()


async def first_piece(request: Request, job: Job[Outcome], pieces: Pieces) -> Delta | Done:
    """The job's first piece, or ``DONE`` when it finished without one; its error raised
    here when it failed first (answered with its status, no stream started)."""
    pieces.follow(job.future)
    try:
        first = await or_disconnect(request, job, pieces.queue.get())
        if isinstance(first, Done):
            job.future.result()  # raises the request's error, answered with its status
    except BaseException:
        job.cancel()
        raise
    return first


async def pieces_then_outcome(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome]
) -> AsyncIterator[Delta | Outcome | BaseException]:
    """The job's pieces, then its outcome (or its error)."""
    item = first
    while isinstance(item, Delta):
        yield item
        item = await pieces.queue.get()
    error = job.future.exception()
    yield error if error is not None else job.future.result()
