"""The scope twin (``--cache-victims auto``): beside the live expert cache, a ghost of it
under the other victims' scope (``bmoe.domain.streaming.victims``): ids only, fed every
request after the live cache's own decisions (and after the rule chooser's, where
adaptive), under the same budget and the rule the live cache has in charge (it follows the
chooser's switches), no reads ahead. Its misses and its evictions of another layer's entry
say what the other scope would have read and moved on the routing met: what
``victims_chooser`` weighs against the live cache's own. When the live cache changes scope
(``set_victims``), the twin takes the other one; each keeps its contents.

The C core's ``cache_twin.pxi`` follows it decision for decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from bmoe.domain.streaming.cache_plans import CacheCounters, Entry, LayerPlan
from bmoe.domain.streaming.ghost_caches import Rule
from bmoe.domain.streaming.victims import Victims


def other_scope(victims: Victims) -> Victims:
    return "global" if victims == "layer" else "layer"


class TwinCache(Protocol):
    """What a twin must answer: the reference policy's request path and its state."""

    counters: CacheCounters

    def request(
        self, layer: int, experts: Iterable[int], n_tokens: int = 1, decode: bool | None = None
    ) -> LayerPlan: ...

    def take_rule(self, rule: Rule) -> None: ...

    def set_budget(self, budget_bytes: int) -> tuple[Entry, ...]: ...

    def evict_all(self) -> tuple[Entry, ...]: ...

    def set_victims(self, victims: Victims) -> None: ...


class ScopeTwin:
    """``cache``: the twin, made empty under the other scope than the live cache's."""

    def __init__(self, cache: TwinCache) -> None:
        self.cache = cache

    def request(self, layer: int, routed: list[int], n_tokens: int, decode: bool, rule: Rule) -> None:
        """Feed one request the live cache just decided, under its ``rule`` in charge now."""
        self.cache.take_rule(rule)
        self.cache.request(layer, routed, n_tokens, decode=decode)

    def set_victims(self, live: Victims) -> None:
        """The live cache takes ``live``: the twin the other scope."""
        self.cache.set_victims(other_scope(live))

    def counters(self) -> dict[str, int]:
        """The twin's hits, misses and evictions of another layer's entry by a request."""
        c = self.cache.counters
        return {"hits": c.hits, "misses": c.misses, "cross_evictions": c.cross_evictions}
