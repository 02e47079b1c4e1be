"""Which victims' scope the live cache runs under ``--cache-victims auto``: the one whose
reads and page moves cost the step less on this machine, measured as the run goes.

Each scope has its price (``victims``): ``global`` evicts the coldest entry of any layer,
and the engine moves that entry's pages under the miss's row (``mremap``: a TLB shootdown
that interrupts the compute threads); ``layer`` evicts the missing layer's own entry, its
row read over in place (no move), at the cost of a few points of hits. Which costs less
depends on the machine: moving an expert's pages (three ``mremap``, one a projection) takes
~40 us of the eval thread on this project's VM (each shootdown's IPI exits to the
hypervisor), much less on a phone; a miss costs the read of an expert
(0.4 ms at 3 GB/s, 6 ms at 400 MiB/s for a 2.5 MiB one).

So over windows of ``WINDOW_TOKENS`` decode tokens the chooser weighs, for the live cache
and its scope twin (``scope_twin``: the same routing under the other scope), **misses x the
cost of a miss + evictions of another layer's entry x the cost of a move**, with the costs
measured in the live run: a miss, the window's wait for reads over its misses; a move, the
eval thread's time moving pages over the pages moved, times ``MOVE_SHARE`` (the compute
threads lose about as much again: measured on the trained bench model at 648 MiB, the eval
thread's management 10.2 ms a token under ``global`` against 2.7 under ``layer``, the
compute beyond the resident step 7.1 against 0.7 ms). Each cost keeps its last measure
while a window has none (no move under ``layer``). The twin's scope takes charge when its
cost is below the live one's by more than ``MARGIN`` of it, over a whole window (the misses
both scopes share are most of either cost: on the trained bench model at 648 MiB the moves
``layer`` saves are about 6% of ``global``'s cost, the misses it adds 2-3%); windows
without both costs measured decide nothing. A change of scope moves nothing by itself (each
cache keeps its entries), so a wrong one costs one window.

Pure policy: the engine (``bmoe.runtime.victims_control``) feeds each window's counters and
applies the scope; nothing here reads a clock.
"""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.scope_twin import other_scope
from bmoe.domain.streaming.victims import Victims

WINDOW_TOKENS = 16
MARGIN = 0.02
MOVE_SHARE = 2.0


@attrs.frozen
class ScopeWindow:
    """One window's counts (differences of the cumulative counters) and timings."""

    tokens: int  # decode steps
    misses: int  # the live cache's
    cross_evictions: int  # ... evictions of another layer's entry (a page move each)
    twin_misses: int  # the scope twin's, on the same requests
    twin_cross_evictions: int
    stall_s: float  # the compute's wait for reads
    move_s: float  # the eval thread's time moving evicted pages under reads
    pages_moved: int  # ... the moves it made


@attrs.frozen
class ScopeVerdict:
    """What one window weighed: each scope's cost in seconds a token (None: not measured yet)."""

    live: Victims
    live_s: float | None
    twin_s: float | None
    switched: bool


class VictimsChooser:
    """``first``: the scope at the start (the live cache's)."""

    def __init__(
        self, first: Victims = "global", *, margin: float = MARGIN, move_share: float = MOVE_SHARE
    ) -> None:
        if margin < 0 or move_share <= 0:
            raise ValueError("the margin must be >= 0 and the move share > 0")
        self.scope: Victims = first
        self.margin = margin
        self.move_share = move_share
        self.miss_s: float | None = None  # the last measured cost of a miss
        self.move_s: float | None = None  # ... of a move (the eval thread's and the compute's)
        self.switches = 0
        self.last: ScopeVerdict | None = None

    def observe(self, window: ScopeWindow) -> ScopeVerdict:
        """Weigh one window; the scope changes (``switched``) where the twin's costs less."""
        if window.misses > 0 and window.stall_s > 0:
            self.miss_s = window.stall_s / window.misses
        if window.pages_moved > 0:
            self.move_s = self.move_share * window.move_s / window.pages_moved
        live_s = twin_s = None
        switched = False
        if self.miss_s is not None and self.move_s is not None and window.tokens > 0:
            live_s = (window.misses * self.miss_s + window.cross_evictions * self.move_s) / window.tokens
            twin_s = (
                window.twin_misses * self.miss_s + window.twin_cross_evictions * self.move_s
            ) / window.tokens
            if twin_s < live_s * (1.0 - self.margin):
                self.scope = other_scope(self.scope)
                self.switches += 1
                switched = True
        self.last = ScopeVerdict(
            other_scope(self.scope) if switched else self.scope, live_s, twin_s, switched
        )
        return self.last
