"""Which entries a request, a budget change or a read ahead evicts, in the policy's order:
the rule in charge (the list's head, or the fewest decayed uses) and the victims' scope
(``victims``: the missing layer's own first). The policy's own state, read and changed from
here so its module holds the list's rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bmoe.domain.streaming.cache_plans import Entry
from bmoe.domain.streaming.victims import layer_victim

if TYPE_CHECKING:
    from bmoe.domain.streaming.cache_policy import ExpertCachePolicy


def evict_until(
    policy: ExpertCachePolicy,
    incoming: int,
    keep: frozenset[Entry],
    everything: bool = False,
    first: int | None = None,
) -> tuple[Entry, ...]:
    """Evict until ``incoming`` more bytes fit (``everything``: all), never an entry of
    ``keep``: from the list's head (slru, or everything), or the smallest use count
    first, the list's order among equals (lfu); layer ``first``'s entries before any
    other's (``layer_first``)."""
    evicted: list[Entry] = []
    while first is not None and not everything and policy.resident_bytes + incoming > policy.budget_bytes:
        victim = layer_victim(policy.resident(), first, keep, policy._uses if policy.rule == "lfu" else None)
        if victim is None:
            break
        policy._evict(victim)
        evicted.append(victim)
    if policy.rule == "lfu" and not everything:
        while policy.resident_bytes + incoming > policy.budget_bytes:
            victim = policy._uses.fewest(policy.resident(), keep)
            if victim is None:
                break
            policy._evict(victim)
            evicted.append(victim)
        return tuple(evicted)
    for entry in policy.resident():
        if not everything and policy.resident_bytes + incoming <= policy.budget_bytes:
            break
        if entry in keep:
            continue
        policy._evict(entry)
        evicted.append(entry)
    return tuple(evicted)
