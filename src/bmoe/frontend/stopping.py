"""How ``bmoe.serve`` and ``bmoe.cli --session`` stop: SIGTERM as SIGINT, gracefully.

A service manager stops a process with SIGTERM (``kill``, ``docker stop``, systemd), a
person with Ctrl-C (SIGINT): both must end it the same way. The first of either asks the
command to stop (``on_first``: take no more requests, end or cancel what runs, then the
command closes its session, which writes the prompt cache's states to ``--cache-disk``,
and exits 0); a second one exits at once (status 128 + the signal's number), writing
nothing more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopping:
    """The handler both signals share (``installed`` puts it in place). ``on_first`` runs
    on a thread of its own, so that it may take locks the interrupted main thread holds."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.on_first = on_first
        self.signals: list[int] = []  # the signals received, in order

    def __call__(self, sig: int, _frame: FrameType | None) -> None:
        self.signals.append(sig)
        if len(self.signals) > 1:
            os._exit(128 + sig)  # the second: at once, nothing more written
        threading.Thread(target=self.on_first, name="bmoe-stop", daemon=True).start()

    @property
    def asked(self) -> bool:
        """A stop was asked (a signal came)."""
        return bool(self.signals)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stopping]:
        """This handler for SIGINT and SIGTERM inside the block (the main thread only), the
        earlier ones restored after it."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        earlier = {sig: signal.signal(sig, self) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in earlier.items():
                signal.signal(sig, handler)
