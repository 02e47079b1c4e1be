"""A generation as an iterator (``Session.stream``) or an async iterator (``Session.astream``).

``generate`` reports tokens through a callback and returns when the reply is done; an app
wants a loop. Here ``generate`` runs on a worker thread of its own and hands each token's
``Progress``, then the ``RunResult`` (or the error), read into items on that thread, over a
queue to the caller's loop: ``follow`` for a plain loop, ``afollow`` for asyncio (the loop
never blocks: the worker puts through ``call_soon_threadsafe``). ``stream`` and ``astream``
read them as ``Piece`` values (``bmoe.domain.pieces``); ``bmoe.llama_compat`` as
llama-cpp-python's chunks.

Leaving the loop early (``break``, an exception, the task cancelled, ``close()``/
``aclose()``) cancels the generation and waits for the worker to end, so the session is
free for the next request when the iterator is closed. CPython closes a plain generator the
loop dropped at once; an async generator is closed by its event loop soon after, or at once
under ``contextlib.aclosing``. A generation that has not begun yet (its request waits for
another's turn) is cancelled when it begins, never the other request.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.pieces import Piece, PieceReader
from bmoe.domain.tools import ToolUse
from bmoe.service.session_engine import OnBegin, OnProgress, SessionEngine

T = TypeVar("T")
Read = Callable[[Progress], Iterable[T]]
"""What one token's ``Progress`` becomes (none, one or more items), on the worker thread."""
Finish = Callable[[RunResult], Iterable[T]]
"""What the ``RunResult`` becomes (the last items), on the worker thread."""


class Generates(Protocol):
    """What the worker runs: ``Session.generate`` and ``Session.cancel``."""

    def generate(
        self,
        request: GenerateRequest,
        on_progress: OnProgress | None = None,
        on_begin: OnBegin | None = None,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> RunResult: ...

    def cancel(self) -> None: ...


@attrs.frozen
class _Failed:
    error: BaseException


class _End:
    pass


_END = _End()


class _Worker(Generic[T]):
    """One ``generate`` on a thread: the items ``read`` makes of each token and ``finish``
    of the result go to ``put``, then ``_END`` (or the error). ``abandon`` cancels it: at
    once when it is in flight, else as it begins (never another request in flight)."""

    def __init__(
        self,
        session: Generates,
        request: GenerateRequest,
        read: Read[T],
        finish: Finish[T],
        put: Callable[[T | _Failed | _End], None],
        history: Sequence[ChatMessage] | None,
        chat: bool | None,
    ) -> None:
        self.session, self.request, self.read, self.finish, self.put = session, request, read, finish, put
        self.history, self.chat = history, chat
        self._lock = threading.Lock()
        self._running = False
        self._abandoned = False
        self.thread = threading.Thread(target=self._run, name="bmoe-stream", daemon=True)

    def _run(self) -> None:
        try:
            result = self.session.generate(
                self.request, self._token, self._began, history=self.history, chat=self.chat
            )
            self._ended()
            for item in self.finish(result):
                self.put(item)
        except BaseException as exc:
            self._ended()
            self.put(_Failed(exc))
            return
        self.put(_END)

    def _token(self, p: Progress) -> None:
        for item in self.read(p):
            self.put(item)

    def _began(self) -> None:
        with self._lock:
            self._running = True
            abandoned = self._abandoned
        if abandoned:
            self.session.cancel()

    def _ended(self) -> None:
        with self._lock:
            self._running = False

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            running = self._running
        if running:
            self.session.cancel()


def follow(
    session: Generates,
    request: GenerateRequest,
    read: Read[T],
    finish: Finish[T],
    *,
    history: Sequence[ChatMessage] | None = None,
    chat: bool | None = None,
) -> Iterator[T]:
    """``session.generate(request, ...)`` on a worker thread, as an iterator of the items
    ``read`` makes of each token and ``finish`` of the result (both called on the worker
    thread, in order); an error is raised here. Nothing starts before the first ``next``;
    closing the iterator early cancels the generation and waits for it to end."""
    items: queue.SimpleQueue[T | _Failed | _End] = queue.SimpleQueue()
    worker = _Worker(session, request, read, finish, items.put, history, chat)
    worker.thread.start()
    ended = False
    try:
        while True:
            item = items.get()
            if isinstance(item, _Failed):
                ended = True
                raise item.error
            if isinstance(item, _End):
                ended = True
                return
            yield item
    finally:
        if not ended:
            worker.abandon()
        worker.thread.join()


async def afollow(
    session: Generates,
    request: GenerateRequest,
    read: Read[T],
    finish: Finish[T],
    *,
    history: Sequence[ChatMessage] | None = None,
    chat: bool | None = None,
) -> AsyncIterator[T]:
    """``follow`` for asyncio: the items arrive without blocking the event loop; the
    worker is waited for on another thread when the iterator closes early."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[T | _Failed | _End] = asyncio.Queue()
    worker: _Worker[T]

    def put(item: T | _Failed | _End) -> None:
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            worker.abandon()

    worker = _Worker(session, request, read, finish, put, history, chat)
    worker.thread.start()
    ended = False
    try:
        while True:
            item = await items.get()
            if isinstance(item, _Failed):
                ended = True
                raise item.error
            if isinstance(item, _End):
                ended = True
                return
            yield item
    finally:
        if not ended:
            worker.abandon()
        await asyncio.to_thread(worker.thread.join)


def reader(engine: SessionEngine, request: GenerateRequest, chat: bool | None = None) -> PieceReader:
    """The piece reader for ``request`` on ``engine``: with tools shown (chat mode), the
    template's call syntax and the reply's grammar (``ToolFormatError`` and the other
    refusals of a request raise here, before anything runs)."""
    tools = ToolUse.shown(request.tools) if (engine.defaults.chat if chat is None else chat) else None
    if tools is None:
        return PieceReader()
    return PieceReader(tools, engine.renderer.tool_format, engine.constraint(request))


def stream(
    session: Generates,
    pieces: PieceReader,
    request: GenerateRequest,
    *,
    history: Sequence[ChatMessage] | None = None,
    chat: bool | None = None,
) -> Iterator[Piece]:
    """The reply's pieces as they are generated; the last carries the ``RunResult``."""
    return follow(session, request, pieces.progress, pieces.finish, history=history, chat=chat)


def astream(
    session: Generates,
    pieces: PieceReader,
    request: GenerateRequest,
    *,
    history: Sequence[ChatMessage] | None = None,
    chat: bool | None = None,
) -> AsyncIterator[Piece]:
    """``stream`` for asyncio."""
    return afollow(session, request, pieces.progress, pieces.finish, history=history, chat=chat)
