"""The expert cache policy: LRU over (layer, expert) entries with a byte budget.

This is the reference the C mechanism (``bmoe.cext.expert_stream``) follows step for step;
tests drive both with the same routing and compare every counter. Per MoE layer, the
engine calls ``request(layer, experts)`` with the experts the router selected: hits are
touched (most recent), misses are loaded, and before loading, least-recently-used entries
that this request does not need are evicted until the new ones fit in the budget. When the
request alone exceeds the budget, everything else is evicted and the budget is exceeded
for that request (the graph needs those experts now).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import attrs

Entry = tuple[int, int]  # (layer, expert)


@attrs.frozen
class RequestOutcome:
    """What one ``request`` did, in order: evictions first, then loads."""

    hits: tuple[Entry, ...]
    loads: tuple[Entry, ...]
    evictions: tuple[Entry, ...]


@attrs.define
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0  # misses of an entry that had been evicted before
    bytes_read: int = 0


class ExpertLru:
    """``entry_bytes`` is the size of one (layer, expert) entry: all its projections."""

    def __init__(self, budget_bytes: int, entry_bytes: int) -> None:
        if budget_bytes < 0 or entry_bytes <= 0:
            raise ValueError("budget must be >= 0 and entry size > 0")
        self.budget_bytes = budget_bytes
        self.entry_bytes = entry_bytes
        self._resident: OrderedDict[Entry, None] = OrderedDict()  # oldest first
        self._evicted_once: set[Entry] = set()
        self._last_request_bytes = 0
        self.counters = CacheCounters()

    @property
    def resident_bytes(self) -> int:
        return len(self._resident) * self.entry_bytes

    def resident(self) -> list[Entry]:
        """Resident entries, least recently used first."""
        return list(self._resident)

    def is_resident(self, entry: Entry) -> bool:
        return entry in self._resident

    def set_budget(self, budget_bytes: int) -> tuple[Entry, ...]:
        """Change the budget; evicts (LRU first) down to it and returns what it evicted."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        self.budget_bytes = budget_bytes
        return tuple(self._evict_until(0, keep=frozenset()))

    def request(self, layer: int, experts: Iterable[int]) -> RequestOutcome:
        wanted = list(dict.fromkeys((layer, int(e)) for e in experts))
        self._last_request_bytes = len(wanted) * self.entry_bytes
        hits = tuple(e for e in wanted if e in self._resident)
        misses = tuple(e for e in wanted if e not in self._resident)
        for entry in hits:
            self._resident.move_to_end(entry)
        evicted = self._evict_until(len(misses) * self.entry_bytes, keep=frozenset(wanted))
        for entry in misses:
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._resident[entry] = None
        self.counters.hits += len(hits)
        self.counters.misses += len(misses)
        self.counters.bytes_read += len(misses) * self.entry_bytes
        return RequestOutcome(hits=hits, loads=misses, evictions=tuple(evicted))

    def _evict_until(self, incoming: int, keep: frozenset[Entry]) -> list[Entry]:
        evicted: list[Entry] = []
        for entry in list(self._resident):
            if self.resident_bytes + incoming <= self.budget_bytes:
                break
            if entry in keep:
                continue
            del self._resident[entry]
            self._evicted_once.add(entry)
            evicted.append(entry)
        self.counters.evictions += len(evicted)
        return evicted

    def check_valid(self) -> None:
        """Invariants: the budget holds unless one request needed more; counters add up."""
        c = self.counters
        assert c.bytes_read == c.misses * self.entry_bytes
        assert c.rereads <= c.misses
        assert len(set(self._resident)) == len(self._resident)
        assert c.misses - c.evictions == len(self._resident)
        assert self.resident_bytes <= max(self.budget_bytes, self._last_request_bytes)
