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

A prompt must not flush decode's cache (scan resistance): a request of several tokens (a
prefill ubatch) that routes more experts than the layer's *share* of the budget (the budget in
entries of that layer divided by the number of MoE layers) keeps only its ``share``
most-routed experts hot (ties: first routed first); its other hits stay where they are and
its other loads enter at the cold end, where the next layers' loads evict them first. After a
long prompt the cache then holds each layer's most-used experts, not the last layers' whole
sets. A decode request (one token) is plain LRU.

An entry holds all projections of one expert of one layer; its size is the layer's
(``entry_bytes[layer]``): real Q4_K_M/Q5_K_M files store some layers' expert projections at
a higher precision than others.

Reads ahead (``prefetch(layer, experts)``): each expert not resident is read in the
background and enters the cache at the *cold* end (the next eviction's first candidate),
after making room LRU-first without evicting the entries the last request is computing
with, nor any entry of this prefetch's own list (resident or just issued); when no room can
be made the rest is not issued. A prefetched entry that a later request routes to is a hit,
*adopted* (the caller waits for its read if it is still in flight); one evicted unused is
counted as wasted. Guesses (the previous token's routing, the stale gate's prediction) enter
cold: a wrong one is the first to go. A *committed* routing (``hot=True``: route-ahead, whose
layer will use exactly these experts) is kept instead: its resident entries are touched
(most recent, in the list's order) and its reads enter at the hot end, so the layers in
between do not evict them before their layer comes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
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
    adopted: tuple[Entry, ...] = ()  # hits on prefetched entries: their reads are waited for


@attrs.frozen
class PrefetchPlan:
    """What one ``prefetch`` decided: evict, then issue (reads in the background)."""

    layer: int
    evictions: tuple[Entry, ...]
    issued: tuple[Entry, ...]


@attrs.define
class CacheCounters:
    """Cumulative counts since the policy was made."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0  # reads (misses or prefetches) of an entry that had been evicted before
    bytes_read: int = 0
    prefetch_issued: int = 0
    prefetch_hits: int = 0  # prefetched entries a request then routed to (useful)
    prefetch_wasted: int = 0  # prefetched entries evicted before any request used them


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
        self._prefetched: set[Entry] = set()  # issued ahead, not yet routed to
        self._protected: frozenset[Entry] = frozenset()  # the last request's entries (in use)
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

    def share(self, layer: int) -> int:
        """How many of a prefill request's experts stay hot at ``layer`` (at least 1)."""
        n_moe = sum(1 for size in self.entry_bytes if size > 0)
        return max(1, self.budget_bytes // self.entry_bytes[layer] // max(1, n_moe))

    def request(self, layer: int, experts: Iterable[int], n_tokens: int = 1) -> LayerPlan:
        """Plan one MoE layer call of ``n_tokens`` tokens (``experts``: every token's routed
        ids, repeats included). Raises ``ValueError`` for a layer without experts or an
        expert id out of range (the state is then unchanged)."""
        routed = [int(e) for e in experts]
        ids = self._checked_ids(layer, routed)
        size = self.entry_bytes[layer]
        wanted = [(layer, e) for e in ids]
        hot = set(wanted)
        if n_tokens > 1 and len(ids) > self.share(layer):
            counts = Counter(routed)
            ranked = sorted(range(len(ids)), key=lambda i: (-counts[ids[i]], i))
            hot = {wanted[i] for i in ranked[: self.share(layer)]}
        hits = tuple(e for e in wanted if e in self._resident)
        loads = tuple(e for e in wanted if e not in self._resident)
        adopted = tuple(e for e in hits if e in self._prefetched)
        self._prefetched.difference_update(adopted)
        self._protected = frozenset(wanted)
        for entry in hits:
            if entry in hot:
                self._resident.move_to_end(entry)
        evictions = self._evict_until(len(loads) * size, keep=frozenset(wanted)) if loads else ()
        if loads:  # only a request that loads evicts: the budget may be exceeded by it alone
            self._last_request_bytes = len(wanted) * size
        for entry in loads:
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._resident[entry] = None
            if entry not in hot:
                self._resident.move_to_end(entry, last=False)  # the cold end
        self.resident_bytes += len(loads) * size
        c = self.counters
        c.requests += 1
        c.hits += len(hits)
        c.misses += len(loads)
        c.bytes_read += len(loads) * size
        c.prefetch_hits += len(adopted)
        return LayerPlan(
            layer=layer,
            hits=hits,
            evictions=evictions,
            loads=loads,
            adopted=adopted,
        )

    def prefetch(self, layer: int, experts: Iterable[int], *, hot: bool = False) -> PrefetchPlan:
        """Plan reads ahead of need for ``layer`` (see the module docstring); ``hot`` for a
        committed routing. Raises ``ValueError`` like ``request`` (the state is then unchanged)."""
        ids = self._checked_ids(layer, experts)
        size = self.entry_bytes[layer]
        evictions: list[Entry] = []
        issued: list[Entry] = []
        keep = self._protected | {(layer, e) for e in ids}
        for entry in ((layer, e) for e in ids):
            if entry in self._resident:
                if hot:
                    self._resident.move_to_end(entry)
                continue
            for old in list(self._resident):
                if self.resident_bytes + size <= self.budget_bytes:
                    break
                if old not in keep:
                    evictions.append(old)
                    self._evict(old)
            if self.resident_bytes + size > self.budget_bytes:
                break  # no room without evicting what is in use: issue no more
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._resident[entry] = None
            if not hot:
                self._resident.move_to_end(entry, last=False)  # the cold end
            self.resident_bytes += size
            self._prefetched.add(entry)
            issued.append(entry)
        self.counters.prefetch_issued += len(issued)
        self.counters.bytes_read += len(issued) * size
        return PrefetchPlan(layer=layer, evictions=tuple(evictions), issued=tuple(issued))

    def _checked_ids(self, layer: int, experts: Iterable[int]) -> list[int]:
        if not 0 <= layer < len(self.entry_bytes) or self.entry_bytes[layer] == 0:
            raise ValueError(f"layer {layer} has no routed experts")
        ids = list(dict.fromkeys(int(e) for e in experts))
        bad = [e for e in ids if not 0 <= e < self.n_expert]
        if bad:
            raise ValueError(f"expert id {bad[0]} out of range [0, {self.n_expert}) at layer {layer}")
        return ids

    def _evict(self, entry: Entry) -> None:
        del self._resident[entry]
        self.resident_bytes -= self.entry_bytes[entry[0]]
        self._evicted_once.add(entry)
        self.counters.evictions += 1
        if entry in self._prefetched:
            self._prefetched.discard(entry)
            self.counters.prefetch_wasted += 1

    def _evict_until(
        self, incoming: int, keep: frozenset[Entry], everything: bool = False
    ) -> tuple[Entry, ...]:
        evicted: list[Entry] = []
        for entry in list(self._resident):
            if not everything and self.resident_bytes + incoming <= self.budget_bytes:
                break
            if entry in keep:
                continue
            self._evict(entry)
            evicted.append(entry)
        return tuple(evicted)

    def check_valid(self) -> None:
        """Invariants: sizes and counters add up; the budget holds unless the last request
        that loaded needed more than it."""
        c = self.counters
        assert len(set(self._resident)) == len(self._resident)
        assert self.resident_bytes == sum(self.entry_bytes[layer] for layer, _ in self._resident)
        assert c.misses + c.prefetch_issued - c.evictions == len(self._resident)
        assert self._prefetched <= set(self._resident)
        assert c.prefetch_hits + c.prefetch_wasted + len(self._prefetched) == c.prefetch_issued
        assert c.rereads <= c.misses + c.prefetch_issued
        assert c.bytes_read >= self.resident_bytes
        assert all(self.entry_bytes[layer] > 0 and 0 <= e < self.n_expert for layer, e in self._resident)
        assert self.resident_bytes <= max(self.budget_bytes, self._last_request_bytes)
