"""One thread that runs a session's requests one at a time, in the order they came.

A session serves one request at a time; HTTP clients come concurrently. ``SessionWorker``
queues their work (``submit``) and runs it on its own thread; each ``Job`` can be cancelled
from any thread, whatever its state:

- queued: it never runs (its future fails with ``RequestCancelledError``);
- running: ``cancel_in_flight`` (the session's ``cancel()``) is called, but only once the
  job's session call is in flight (the job calls ``began()`` from its ``on_begin``), so a
  cancel can never reach another job's request;
- done: nothing happens.

The job's ``future`` (a ``concurrent.futures.Future``) holds what the work returned or the
error it raised.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from bmoe.serve.errors import RequestCancelledError, ServerClosedError

T = TypeVar("T")


class Job(Generic[T]):
    """One request's work; see the module's docstring for ``cancel``."""

    def __init__(self, work: Callable[[Job[T]], T], cancel_in_flight: Callable[[], None]) -> None:
        self.future: Future[T] = Future()
        self._work = work
        self._cancel_in_flight = cancel_in_flight
        self._lock = threading.Lock()
        self._cancel_asked = False
        self._began = False
        self._done = False

    @property
    def cancel_asked(self) -> bool:
        return self._cancel_asked

    def cancel(self) -> None:
        """Cancel this job (any thread; idempotent; nothing once it is done)."""
        with self._lock:
            if self._done or self._cancel_asked:
                return
            self._cancel_asked = True
            if self._began:
                self._cancel_in_flight()

    def began(self) -> None:
        """The job's session call is in flight (its ``on_begin``): from now on a cancel
        reaches it, and one asked earlier is passed on now."""
        with self._lock:
            self._began = True
            if self._cancel_asked:
                self._cancel_in_flight()

    def run(self) -> None:
        """Do the work (on the worker's thread) and settle the future."""
        with self._lock:
            skip = self._cancel_asked
        if skip or not self.future.set_running_or_notify_cancel():
            self._finish()
            if not self.future.cancelled():
                self.future.set_exception(RequestCancelledError("the request was cancelled before it ran"))
            return
        try:
            result = self._work(self)
        except BaseException as exc:
            self._finish()
            self.future.set_exception(exc)
        else:
            self._finish()
            self.future.set_result(result)

    def settle(self, result: T | None = None, error: BaseException | None = None) -> None:
        """End a job that no worker runs (a parallel sequence's): its future gets ``error``,
        or ``result``. Once; later calls do nothing."""
        with self._lock:
            if self._done:
                return
            self._done = True
        if not self.future.set_running_or_notify_cancel():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)  # type: ignore[arg-type]

    def _finish(self) -> None:
        with self._lock:
            self._done = True


class SessionWorker:
    """A thread serving jobs in order; ``cancel_in_flight`` stops the one running."""

    def __init__(self, cancel_in_flight: Callable[[], None], name: str = "bmoe-serve-worker") -> None:
        self._cancel_in_flight = cancel_in_flight
        self._jobs: collections.deque[Job[object]] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._current: Job[object] | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[Job[T]], T]) -> Job[T]:
        """Queue ``work``; it runs after every job submitted before it. Raises
        ``ServerClosedError`` once the worker is closed."""
        job: Job[T] = Job(work, self._cancel_in_flight)
        with self._ready:
            if self._closed:
                raise ServerClosedError("the server is shutting down")
            self._jobs.append(job)  # type: ignore[arg-type]  # the deque holds jobs of any result type
            self._ready.notify()
        return job

    @property
    def pending(self) -> int:
        """Jobs queued and not yet started."""
        with self._ready:
            return len(self._jobs)

    def close(self, timeout: float | None = None) -> None:
        """Take no more jobs, cancel the queued ones and the one running, and wait (up to
        ``timeout`` seconds) for the thread to end. Idempotent."""
        with self._ready:
            self._closed = True
            jobs = [*self._jobs, *([self._current] if self._current is not None else [])]
            self._ready.notify()
        for job in jobs:
            job.cancel()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if not self._jobs:
                    return
                job = self._current = self._jobs.popleft()
            job.run()
            with self._ready:
                self._current = None
