"""Progress on stderr: which configuration, tokens done, time left.

With ``rich`` and a terminal, live bars (the configuration's and the whole run's, each with
its ETA); otherwise a plain line every few seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol


class Progress(Protocol):
    def begin(self, label: str, total: int) -> None: ...
    def update(self, done: int) -> None: ...
    def end(self, message: str) -> None: ...
    def note(self, message: str) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """A line per configuration and one every ``every`` seconds while it decodes."""

    def __init__(self, total: int, every: float = 5.0) -> None:
        self.total = total
        self.every = every
        self.base = 0
        self.t0 = time.monotonic()
        self.label = ""
        self.run_total = 0
        self.done = 0
        self.last = 0.0

    def _eta(self) -> str:
        finished = self.base + self.done
        elapsed = time.monotonic() - self.t0
        if finished <= 0:
            return "?"
        return f"{elapsed * (self.total - finished) / finished:.0f} s"

    def begin(self, label: str, total: int) -> None:
        self.label, self.run_total, self.done = label, total, 0
        print(f"bench: {label} ...", file=sys.stderr, flush=True)

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(
                f"bench:   {done}/{self.run_total} tokens, whole run ETA {self._eta()}",
                file=sys.stderr,
                flush=True,
            )

    def end(self, message: str) -> None:
        self.base += self.run_total
        print(f"bench:   {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class RichProgress:
    """Two live bars on stderr: the configuration running and the whole run."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bars

        self.console = Console(stderr=True, highlight=False)
        self.bars = Bars(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.bars.start()
        self.all: Any = self.bars.add_task("whole run (tokens)", total=total)
        self.run: Any = None
        self.base = 0

    def begin(self, label: str, total: int) -> None:
        if self.run is not None:
            self.bars.remove_task(self.run)
        self.run = self.bars.add_task(label, total=total)

    def update(self, done: int) -> None:
        self.bars.update(self.run, completed=done)
        self.bars.update(self.all, completed=self.base + done)

    def end(self, message: str) -> None:
        total = next(t.total for t in self.bars.tasks if t.id == self.run) or 0
        self.base += int(total)
        self.bars.update(self.all, completed=self.base)
        self.console.print(f"bench: {message}")

    def note(self, message: str) -> None:
        self.console.print(f"bench: {message}")

    def close(self) -> None:
        self.bars.stop()


def make_progress(total: int) -> Progress:
    """Rich bars on a terminal (when rich is installed), plain lines otherwise."""
    if sys.stderr.isatty():
        try:
            return RichProgress(total)
        except ImportError:
            pass
    return PlainProgress(total)
