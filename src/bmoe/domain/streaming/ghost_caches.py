"""Ghost caches: beside the live expert cache, one cache per eviction rule that holds entry
ids only (no bytes are read for them, none kept), fed the same requests as the live cache,
under the same byte budget and the layer's entry sizes: what each rule would have hit on
the routing this run meets.

A ghost is the reference policy itself (``ExpertCachePolicy`` with its rule fixed) fed
only the requests: the same list, segments, scan resistance (a prefill's cold loads at the
list's head), decayed use counts and protected cap, and no reads ahead (those are the live
cache's own guesses, not the rule's). So the ghost of the rule the live cache runs holds
exactly what the live cache holds when nothing else differs (no reads ahead, no switch).

The rules (``RULES``): ``lru`` (the list with the protected segment's cap 0: a plain LRU),
``slru`` (the segmented list, the head evicted) and ``lfu`` (the same list, the smallest
decayed use count evicted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from bmoe.domain.streaming.cache_plans import Entry, LayerPlan
from bmoe.domain.streaming.victims import Victims

Rule = Literal["lru", "slru", "lfu"]
RULES: tuple[Rule, ...] = ("lru", "slru", "lfu")


class GhostCache(Protocol):
    """What a ghost must answer: the reference policy's request path."""

    def request(
        self, layer: int, experts: Iterable[int], n_tokens: int = 1, decode: bool | None = None
    ) -> LayerPlan: ...

    def set_budget(self, budget_bytes: int) -> tuple[Entry, ...]: ...

    def evict_all(self) -> tuple[Entry, ...]: ...

    def set_victims(self, victims: Victims) -> None: ...


class GhostCaches:
    """One ghost per rule of ``RULES`` (``make(rule)`` builds it); ``hits[rule]`` counts each
    one's hits over every request fed, ``wanted`` the entries requested (the same for all)."""

    def __init__(self, make: Callable[[Rule], GhostCache]) -> None:
        self.caches: dict[Rule, GhostCache] = {rule: make(rule) for rule in RULES}
        self.hits: dict[Rule, int] = dict.fromkeys(RULES, 0)
        self.wanted = 0

    def request(
        self, layer: int, routed: list[int], n_tokens: int, decode: bool
    ) -> tuple[int, dict[Rule, int]]:
        """Feed one request to every ghost: the distinct entries it wants and each ghost's
        hits on them."""
        hits = {
            rule: len(cache.request(layer, routed, n_tokens, decode=decode).hits)
            for rule, cache in self.caches.items()
        }
        wanted = len(set(routed))
        self.wanted += wanted
        for rule, n in hits.items():
            self.hits[rule] += n
        return wanted, hits

    def set_budget(self, budget_bytes: int) -> None:
        for cache in self.caches.values():
            cache.set_budget(budget_bytes)

    def evict_all(self) -> None:
        for cache in self.caches.values():
            cache.evict_all()

    def hit_pct(self) -> dict[Rule, float]:
        """Each ghost's hit rate over every request fed, in percent (0 before any)."""
        return {rule: 100.0 * n / self.wanted if self.wanted else 0.0 for rule, n in self.hits.items()}
