"""The expert cache policy: LRU over (layer, expert) entries with a byte budget.

This is the reference the C engine (``bmoe.cext.expert_stream``) follows decision for
decision; tests drive both with the same requests and compare every plan and counter.

Per MoE layer the engine asks ``request(layer, experts)`` with the experts the router
selected (for a batch of tokens: every token's, in token order). The plan it returns says,
in order of execution: which resident entries are hits (touched: most recent, in wanted
order), which least-recently-used entries are evicted (oldest first, never one this layer
wants) until the misses fit in the budget, and which entries must be loaded (in wanted
order). When the wanted entries alone exceed the budget, everything else is evicted and the
budget is exceeded for that request: the graph needs those experts now.

An entry holds all projections of one expert of one layer; its size is the layer's
(``entry_bytes[layer]``): real Q4_K_M/Q5_K_M files store some layers' expert projections at
a higher precision than others.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import attrs

Entry = tuple[int, int]  # (layer, expert)


@attrs.frozen
class LayerPlan:
    """What one ``request`` decided, in order of execution: evict, then load."""

    layer: int
    hits: tuple[Entry, ...]
    evictions: tuple[Entry, ...]
    loads: tuple[Entry, ...]
    load_bytes: int


@attrs.define
class CacheCounters:
    """Cumulative counts since the policy was made."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0  # misses of an entry that had been evicted before
    bytes_read: int = 0


class ExpertCachePolicy:
    """``entry_bytes[layer]``: the size of one entry of that layer (0: no routed experts)."""

    def __init__(self, budget_bytes: int, entry_bytes: Sequence[int], n_expert: int) -> None:
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        if n_expert <= 0 or any(b < 0 for b in entry_bytes):
            raise ValueError("n_expert must be > 0 and entry sizes >= 0")
        self.budget_bytes = budget_bytes
        self.entry_bytes = tuple(entry_bytes)
        self.n_expert = n_expert
        self.resident_bytes = 0
        self._resident: OrderedDict[Entry, None] = OrderedDict()  # oldest first
        self._evicted_once: set[Entry] = set()
        self._last_request_bytes = 0
        self.counters = CacheCounters()

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
        return self._evict_until(0, keep=frozenset())

    def evict_all(self) -> tuple[Entry, ...]:
        """Evict every resident entry, oldest first, and return them."""
        return self._evict_until(0, keep=frozenset(), everything=True)

    def request(self, layer: int, experts: Iterable[int]) -> LayerPlan:
        """Plan one MoE layer call. Raises ``ValueError`` for a layer without experts or an
        expert id out of range (the state is then unchanged)."""
        if not 0 <= layer < len(self.entry_bytes) or self.entry_bytes[layer] == 0:
            raise ValueError(f"layer {layer} has no routed experts")
        ids = list(dict.fromkeys(int(e) for e in experts))
        bad = [e for e in ids if not 0 <= e < self.n_expert]
        if bad:
            raise ValueError(f"expert id {bad[0]} out of range [0, {self.n_expert}) at layer {layer}")
        size = self.entry_bytes[layer]
        wanted = [(layer, e) for e in ids]
        hits = tuple(e for e in wanted if e in self._resident)
        loads = tuple(e for e in wanted if e not in self._resident)
        for entry in hits:
            self._resident.move_to_end(entry)
        evictions = self._evict_until(len(loads) * size, keep=frozenset(wanted)) if loads else ()
        if loads:  # only a request that loads evicts: the budget may be exceeded by it alone
            self._last_request_bytes = len(wanted) * size
        for entry in loads:
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._resident[entry] = None
        self.resident_bytes += len(loads) * size
        c = self.counters
        c.requests += 1
        c.hits += len(hits)
        c.misses += len(loads)
        c.bytes_read += len(loads) * size
        return LayerPlan(
            layer=layer, hits=hits, evictions=evictions, loads=loads, load_bytes=len(loads) * size
        )

    def _evict_until(
        self, incoming: int, keep: frozenset[Entry], everything: bool = False
    ) -> tuple[Entry, ...]:
        evicted: list[Entry] = []
        for entry in list(self._resident):
            if not everything and self.resident_bytes + incoming <= self.budget_bytes:
                break
            if entry in keep:
                continue
            del self._resident[entry]
            self.resident_bytes -= self.entry_bytes[entry[0]]
            self._evicted_once.add(entry)
            evicted.append(entry)
        self.counters.evictions += len(evicted)
        return tuple(evicted)

    def check_valid(self) -> None:
        """Invariants: sizes and counters add up; the budget holds unless the last request
        that loaded needed more than it."""
        c = self.counters
        assert len(set(self._resident)) == len(self._resident)
        assert self.resident_bytes == sum(self.entry_bytes[layer] for layer, _ in self._resident)
        assert c.misses - c.evictions == len(self._resident)
        assert c.rereads <= c.misses
        assert c.bytes_read >= self.resident_bytes
        assert all(self.entry_bytes[layer] > 0 and 0 <= e < self.n_expert for layer, e in self._resident)
        assert self.resident_bytes <= max(self.budget_bytes, self._last_request_bytes)
