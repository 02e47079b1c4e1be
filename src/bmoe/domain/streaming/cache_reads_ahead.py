"""Reads ahead (``prefetch(layer, experts)``): each expert not resident is read in the
background and enters probation at the *cold* end (the next eviction's first candidate),
after making room from the head of the eviction order without evicting the entries the last
request is computing with, nor any entry of this prefetch's own list (resident or just
issued); when no room can be made the rest is not issued. A prefetched entry that a later
request routes to is a hit, *adopted* (the caller waits for its read if it is still in
flight); one evicted unused is counted as wasted. A usage profile's warm-up
(``prefetch(..., warm=True)``) reads ahead the same way but is not a guess: the first request
that routes to a warmed entry counts it as a plain hit (promoted by a decode hit as any entry
used before, not a prefetch hit), yet it is *adopted* all the same, because its read may still
be in flight. The rule the engine keeps: **an entry read ahead (prefetched or warmed) is
usable only once its read has completed; the first request that routes to it lists it in
``adopted`` and its caller waits for that read, exactly as for its own loads.** Guesses
(the previous token's routing, the stale gate's prediction) enter cold: a wrong one is the
first to go. A *committed* routing (``hot=True``: route-ahead, whose layer will use exactly
these experts) is kept instead: its resident entries are touched (most recent in their
segment, in the list's order) and its reads enter at probation's most recent end, so the
layers in between do not evict them before their layer comes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from bmoe.domain.streaming.cache_eviction import evict_until
from bmoe.domain.streaming.cache_plans import Entry, PrefetchPlan

if TYPE_CHECKING:
    from bmoe.domain.streaming.cache_policy import ExpertCachePolicy


def plan_reads_ahead(
    policy: ExpertCachePolicy, layer: int, experts: Iterable[int], *, hot: bool = False, warm: bool = False
) -> PrefetchPlan:
    """``policy.prefetch``: plan reads ahead of need for ``layer`` (this module's docstring,
    on the policy's list); ``hot`` for a committed routing; ``warm`` for a usage profile's
    warm-up, counted in ``warm_issued`` and not as a prefetch (a request that routes to one
    is a plain hit, adopted all the same: its read may still be in flight). Raises
    ``ValueError`` like ``request`` (the state is then unchanged)."""
    ids = policy._checked_ids(layer, experts)
    size = policy.entry_bytes[layer]
    evictions: list[Entry] = []
    issued: list[Entry] = []
    keep = policy._protected | {(layer, e) for e in ids}
    for entry in ((layer, e) for e in ids):
        if policy.is_resident(entry):
            if hot:
                policy._touch(entry)
            continue
        evictions += evict_until(policy, size, keep)
        if policy.resident_bytes + size > policy.budget_bytes:
            break  # no room without evicting what is in use: issue no more
        if entry in policy._evicted_once:
            policy.counters.rereads += 1
        policy._probation[entry] = None
        if not hot:
            policy._probation.move_to_end(entry, last=False)  # the cold end
        policy.resident_bytes += size
        (policy._warmed if warm else policy._prefetched).add(entry)
        issued.append(entry)
    if warm:
        policy.counters.warm_issued += len(issued)
    else:
        policy.counters.prefetch_issued += len(issued)
    policy.counters.bytes_read += len(issued) * size
    return PrefetchPlan(layer=layer, evictions=tuple(evictions), issued=tuple(issued))
