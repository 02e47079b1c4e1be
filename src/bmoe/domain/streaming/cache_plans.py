"""The expert cache policy's values: an entry, the plans a request or a read ahead decides,
and the cumulative counters (``bmoe.domain.streaming.cache_policy`` says what they mean)."""

from __future__ import annotations

import attrs

Entry = tuple[int, int]  # (layer, expert)


@attrs.frozen
class LayerPlan:
    """What one ``request`` decided, in order of execution: evict, then load."""

    layer: int
    hits: tuple[Entry, ...]
    evictions: tuple[Entry, ...]
    loads: tuple[Entry, ...]
    # hits on entries read ahead (prefetched or warmed) and not routed to before: their
    # reads may still be in flight, the caller waits for them
    adopted: tuple[Entry, ...] = ()


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
    warm_issued: int = 0  # entries a usage profile's warm-up read ahead (not prefetches)
    prefetch_wasted: int = 0  # prefetched entries evicted before any request used them
    passed: int = 0  # layer calls that needed nothing: the layer held whole (``pass_layer``)
    cross_evictions: int = 0  # evictions of another layer's entry by a request (the engine moves
    # its pages under the miss; one of the missing layer's own takes its row: ``victims``)
