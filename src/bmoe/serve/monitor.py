"""``EngineMonitor``: what the session's worker is doing, for the live metrics feed.

The worker's thread reports each request (``request()``, a context manager around the
session call) and each token (``token()``); any thread reads a ``MonitorView`` (``view()``)
and may ``subscribe`` a callback told after every change (it runs on the worker's thread:
it must only hand the news over, e.g. ``loop.call_soon_threadsafe``). Everything is under
one small lock; nothing here waits for the session.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import attrs

from bmoe.domain.generation import Progress
from bmoe.domain.live import LiveTotals
from bmoe.serve.errors import RequestCancelledError
from bmoe.serve.live import Kind, MonitorView, Outcome, RequestView

Feeding = Callable[[], tuple[int, int]]  # the session's (tokens decoded, to decode)
Listener = Callable[[], None]


def _no_feeding() -> tuple[int, int]:
    return (0, 0)


@attrs.define
class _Request:
    number: int
    kind: Kind
    began: float
    feeding0: tuple[int, int]  # the session's feeding when it began (not this request's)
    totals: LiveTotals = attrs.field(factory=LiveTotals)
    outcome: Outcome | None = None
    prefill_s: float | None = None
    prefill: tuple[int, int] = (0, 0)
    ended: float | None = None


class EngineMonitor:
    """Fed by the worker's thread, read from any thread. ``feeding``: the session's
    prefill progress (``Session.feeding``)."""

    def __init__(self, feeding: Feeding = _no_feeding, clock: Callable[[], float] = time.monotonic) -> None:
        self._feeding = feeding
        self._clock = clock
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._number = 0
        self._finished = 0
        self._current: _Request | None = None

    # -- the worker's side -----------------------------------------------------------------

    @contextlib.contextmanager
    def request(self, kind: Kind) -> Iterator[None]:
        """Around one request's session call: its outcome is ``cancelled`` when it raises
        ``RequestCancelledError``, ``error`` for any other exception, else ``done``."""
        with self._lock:
            self._number += 1
            self._current = _Request(self._number, kind, self._clock(), self._feeding())
        self._changed()
        outcome: Outcome = "error"
        try:
            yield
            outcome = "done"
        except RequestCancelledError:
            outcome = "cancelled"
            raise
        finally:
            with self._lock:
                r = self._current
                if r is not None:
                    if r.prefill_s is None:  # it ended before its first token
                        r.prefill = self._prefill(r)
                    r.outcome, r.ended = outcome, self._clock()
                self._finished += 1
            self._changed()

    def token(self, p: Progress) -> None:
        """One generated token of the request in flight."""
        with self._lock:
            r = self._current
            if r is None or r.outcome is not None:
                return
            if r.prefill_s is None:
                r.prefill = self._prefill(r)
                r.prefill_s = self._clock() - r.began
            r.totals.add(p)
        self._changed()

    # -- any thread ------------------------------------------------------------------------

    def view(self) -> MonitorView:
        with self._lock:
            r = self._current
            if r is None:
                return MonitorView(self._finished)
            prefill = r.prefill if r.prefill_s is not None or r.outcome is not None else self._prefill(r)
            end = r.ended if r.ended is not None else self._clock()
            request = RequestView(
                number=r.number,
                kind=r.kind,
                elapsed_s=end - r.began,
                totals=attrs.evolve(r.totals),
                outcome=r.outcome,
                prefill_done=prefill[0],
                prefill_total=prefill[1],
                prefill_s=r.prefill_s,
            )
            return MonitorView(self._finished, request)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after every change (on the thread that made it); returns the
        function that stops it."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    # -- inside ----------------------------------------------------------------------------

    def _prefill(self, r: _Request) -> tuple[int, int]:
        """The request's prefill so far: the session's feeding, unless it is still the one
        of the call before this request (the same tuple: no chunk of this one yet)."""
        now = self._feeding()
        return (0, 0) if now is r.feeding0 else now

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
