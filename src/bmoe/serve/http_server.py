"""uvicorn's server, its signals left to ``bmoe.frontend.stopping``.

uvicorn catches SIGINT and SIGTERM while it runs and, once shut down, raises the signal
again with the handlers it found: SIGTERM's default then killed the process (exit 143)
before the session was closed, so the prompt cache never reached ``--cache-disk``. Here
uvicorn leaves the signals alone; the command's ``Stopping`` handler asks it to exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn


class HttpServer(uvicorn.Server):
    """``uvicorn.Server`` that neither catches nor raises signals again: ``stop()`` (any
    thread) ends it as a first Ctrl-C would (no new connections, those in flight finished
    within ``timeout_graceful_shutdown``)."""

    @classmethod
    def of(cls, app: Any, log_level: str) -> HttpServer:
        """A server of ``app`` that waits 10 s for the requests in flight when it stops."""
        return cls(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10))

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def stop(self) -> None:
        self.should_exit = True
