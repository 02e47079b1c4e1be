"""``--progress`` in one-shot mode: tokens, tok/s, hit rate and MiB read, live on stderr.

With ``rich`` (``.venv/bin/pip install -e '.[bench]'`` from a checkout) and a terminal on
stderr, a live bar that is cleared at the end; otherwise a plain ``progress:`` line about
once a second and a last one at the end. When stdout is a terminal too, the answer goes through rich's console
(above the bar) a whole line at a time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from bmoe.domain.generation import Progress
from bmoe.domain.metrics import RunningTotals


class LiveDisplay(Protocol):
    # True while the display owns sys.stdout (rich, stdout on the terminal): the answer is
    # then written a whole line at a time, so callers should not flush after each token
    holds_stdout: bool

    def update(self, p: Progress) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """A ``progress:`` line every ``every`` seconds, and the last one on ``close``."""

    def __init__(self, out: TextIO, every: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.holds_stdout = False
        self.out = out
        self.every = every
        self.clock = clock
        self.totals = RunningTotals()
        self.last = clock()
        self.shown = -1  # the token count of the last line written

    def update(self, p: Progress) -> None:
        self.totals.add(p)
        now = self.clock()
        if now - self.last >= self.every:
            self._show()
            self.last = now

    def _show(self) -> None:
        print(self.totals.line(), file=self.out, flush=True)
        self.shown = self.totals.tokens

    def close(self) -> None:
        if self.totals.tokens != self.shown:
            self._show()


class RichDisplay:
    """A rich live bar on stderr: tokens out of -n, then the running figures."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as Bars

        self.totals = RunningTotals()
        self.holds_stdout = sys.stdout.isatty()
        self.console = Console(stderr=True, highlight=False)
        self.bars = Bars(
            TextColumn("generating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[figures]}"),
            console=self.console,
            transient=True,
            redirect_stdout=self.holds_stdout,
            redirect_stderr=False,
        )
        self.task: Any = self.bars.add_task("", total=None, figures="")
        self.bars.start()

    def update(self, p: Progress) -> None:
        self.totals.add(p)
        figures = self.totals.line().removeprefix("progress: ").split(", ", 1)[-1]
        self.bars.update(self.task, completed=p.step, total=p.steps, figures=figures)

    def close(self) -> None:
        if self.holds_stdout:
            sys.stdout.flush()  # the answer's last partial line, above the bar
        self.bars.stop()
        self.holds_stdout = False
        self.console.print(self.totals.line())


def make_display(stderr: TextIO | None = None) -> LiveDisplay:
    """Rich on a terminal when rich is installed, plain lines otherwise."""
    out = stderr if stderr is not None else sys.stderr
    if out is sys.stderr and out.isatty():
        try:
            return RichDisplay()
        except ImportError:
            pass
    return PlainDisplay(out)


class LoadProgress:
    """Model loading and the streaming setup, on stderr, once they take more than ``after``
    seconds: a rich bar on a terminal (when rich is installed), else a ``loading:`` line at
    most every ``every`` seconds and one when a phase ends."""

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        after: float = 1.0,
        every: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out if out is not None else sys.stderr
        self.after = after
        self.every = every
        self.clock = clock
        self.start = clock()
        self.last = -1.0e9
        self.phase = ""
        self._bar: Any = None
        self._task: Any = None
        self._rich = self.out.isatty() and _has_rich()

    def __call__(self, phase: str, fraction: float) -> None:
        now = self.clock()
        if now - self.start < self.after:
            return
        if self._rich:
            self._rich_update(phase, fraction)
            return
        if phase != self.phase or fraction >= 1.0 or now - self.last >= self.every:
            print(f"loading: {phase} {100 * fraction:.0f}%", file=self.out, flush=True)
            self.last = now
            self.phase = phase

    def _rich_update(self, phase: str, fraction: float) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                console=Console(file=self.out), transient=True,
            )  # fmt: skip
            self._bar.start()
        if phase != self.phase or self._task is None:
            self._task = self._bar.add_task(phase, total=1.0)
            self.phase = phase
        self._bar.update(self._task, completed=fraction)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True
