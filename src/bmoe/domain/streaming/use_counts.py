"""Decayed use counts: what the cache's eviction by frequency (``eviction="lfu"``,
``--cache-policy lfu``) chooses by.

Each entry, resident or not, has a use count: every request that routes to it adds 1 (a
prefill's request too, once per entry and request, however many of its tokens route there;
reads ahead add nothing). Every ``half_life`` decode tokens (``half_life`` times the number
of MoE layers decode requests) every count is halved (integer division): a count is the
recent uses, decayed. Where SLRU evicts the list's head, LFU evicts the entry with the
smallest count that may be evicted (not one the request or the prefetch keeps), the first
in the list's order among equal counts: an entry read ahead and never used (count 0) or
used once long ago goes before one the routing keeps coming back to, whatever their recency.
"""

from __future__ import annotations

from collections.abc import Iterable

from bmoe.domain.streaming.cache_plans import Entry

DEFAULT_HALF_LIFE = 64
"""LFU's counts halve every this many decode tokens."""


class UseCounts:
    """The counts of every entry routed to, halved every ``half_life`` tokens of
    ``n_moe`` decode requests each."""

    def __init__(self, half_life: int, n_moe: int) -> None:
        if half_life < 1:
            raise ValueError(f"half_life must be >= 1 decode token, not {half_life}")
        self.half_life = half_life
        self.n_moe = max(1, n_moe)
        self._uses: dict[Entry, int] = {}  # absent: 0
        self._ticks = 0  # decode requests since the counts were last halved

    def __getitem__(self, entry: Entry) -> int:
        return self._uses.get(entry, 0)

    def add(self, entries: Iterable[Entry]) -> None:
        """One request routed to each of ``entries`` (distinct)."""
        uses = self._uses
        for entry in entries:
            uses[entry] = uses.get(entry, 0) + 1

    def tick(self) -> None:
        """One decode request: every ``half_life`` tokens' worth, halve every count."""
        self._ticks += 1
        if self._ticks < self.half_life * self.n_moe:
            return
        self._ticks = 0
        self._uses = {entry: n // 2 for entry, n in self._uses.items() if n > 1}

    def fewest(self, order: Iterable[Entry], keep: frozenset[Entry]) -> Entry | None:
        """The entry of ``order`` not in ``keep`` with the smallest count, the first in
        ``order`` among equals; None when there is none."""
        uses = self._uses
        return min((e for e in order if e not in keep), key=lambda e: uses.get(e, 0), default=None)
