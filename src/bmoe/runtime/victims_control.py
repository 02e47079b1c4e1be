"""``--cache-victims auto`` in a streaming run: at each decode boundary (``before_decode``),
every ``WINDOW_TOKENS`` decode steps, the window's counters go to the chooser
(``bmoe.domain.streaming.victims_chooser``) and its scope to the cache (the C streamer, or
the reference policy), between decodes. A prompt's reads are not decode's: a window that
meets one starts again after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bmoe.domain.streaming import StreamCounters
from bmoe.domain.streaming.victims import Victims
from bmoe.domain.streaming.victims_chooser import WINDOW_TOKENS, ScopeWindow, VictimsChooser


class ScopeTarget(Protocol):
    def set_victims(self, victims: Victims) -> None: ...


def window_between(before: StreamCounters, after: StreamCounters, tokens: int) -> ScopeWindow:
    """The window's counts and timings: ``after`` less ``before``."""
    return ScopeWindow(
        tokens=tokens,
        misses=after.misses - before.misses,
        cross_evictions=after.cross_evictions - before.cross_evictions,
        twin_misses=after.twin_misses - before.twin_misses,
        twin_cross_evictions=after.twin_cross_evictions - before.twin_cross_evictions,
        stall_s=after.stall_s - before.stall_s,
        move_s=after.release_s - before.release_s,
        pages_moved=after.pages_recycled - before.pages_recycled,
    )


class VictimsControl:
    """``counters``: the cache's cumulative counters now; ``target``: what takes the scope."""

    def __init__(
        self,
        counters: Callable[[], StreamCounters],
        target: ScopeTarget,
        window_tokens: int = WINDOW_TOKENS,
    ) -> None:
        if window_tokens < 1:
            raise ValueError("the window must be >= 1 decode token")
        self.chooser = VictimsChooser("global")
        self.window_tokens = window_tokens
        self._counters = counters
        self._target = target
        self._base: StreamCounters | None = None  # the window's start (None: none open)
        self._tokens = 0
        self._last_decode = False

    def before_decode(self, decode: bool) -> None:
        """A ``llama_decode`` comes, a decode step (``decode``) or a prompt's: the step before
        it ended, counted in the window where it was a decode step."""
        if self._base is not None and self._last_decode:
            self._tokens += 1
            if self._tokens >= self.window_tokens:
                self._weigh()
        if not decode:
            self._base = None
        elif self._base is None:
            self._base, self._tokens = self._counters(), 0
        self._last_decode = decode

    def _weigh(self) -> None:
        assert self._base is not None
        now = self._counters()
        verdict = self.chooser.observe(window_between(self._base, now, self._tokens))
        if verdict.switched:
            self._target.set_victims(self.chooser.scope)
        self._base, self._tokens = now, 0
