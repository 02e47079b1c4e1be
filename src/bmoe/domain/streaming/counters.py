"""The figures a streaming run reports: cumulative counters and per-generate reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from bmoe.domain.streaming.config import MIB


def _layer_delta(
    after: tuple[tuple[int, int], ...], before: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    if not before:
        return after
    return tuple((a0 - b0, a1 - b1) for (a0, a1), (b0, b1) in zip(after, before, strict=True))


# states: a difference keeps the later one
_SIZES = ("resident_bytes", "budget_bytes", "rank_worker", "cache_rule", "cache_victims")
_MECHANISM = {  # how the mechanism executed the policy: timers, and when pages went back
    "io_s": 0.0,
    "mgmt_s": 0.0,
    "stall_s": 0.0,
    "release_s": 0.0,
    "release_lanes_s": 0.0,
    "releases_deferred": 0,
    "releases_cancelled": 0,
    "pages_recycled": 0,
    "rows_swapped": 0,
    "evict_waits": 0,
    "evict_wait_s": 0.0,
    "reads_orphaned": 0,
    "orphans_cut": 0,
    "bytes_landed": 0,
    "bytes_in_place": 0,
    "projection_waits": 0,
    "rank_s": 0.0,
    "rank_wait_s": 0.0,
    "rank_worker": False,
    "issue_s": 0.0,
    "stall_layers": (),
    "stall_ahead_s": 0.0,
    "minor_faults": 0,
    "system_s": 0.0,
    "land_s": 0.0,
    "lane_cpu_s": 0.0,
}


@attrs.frozen
class StreamCounters:
    """Cumulative counters of the streaming mechanism (a snapshot)."""

    requests: int = 0  # MoE layer calls served (one per layer per ubatch)
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0
    bytes_read: int = 0
    io_s: float = 0.0  # the read lanes' busy time (summed over lanes)
    mgmt_s: float = 0.0
    resident_bytes: int = 0
    budget_bytes: int = 0
    stall_s: float = 0.0  # time the compute waited for reads
    stall_layers: tuple[float, ...] = ()  # stall_s by layer (the fast path's)
    stall_ahead_s: float = 0.0  # the part of stall_s in layer calls that missed nothing: waiting
    # for reads issued ahead (prefetch, prediction, route-ahead) that had not landed yet
    prefetch_issued: int = 0
    prefetch_hits: int = 0
    prefetch_wasted: int = 0
    warm_issued: int = 0  # read ahead by a usage profile's warm-up (not prefetches: their hits are hits)
    passed: int = 0  # layer calls passed: the layer held whole (no request, no graph stop)
    # the eviction rule in charge ("" where not reported) and, under --cache-policy adaptive,
    # the chooser's switches and the ghost caches' hits on the entries requested of them
    cache_rule: str = ""
    rule_switches: int = 0
    ghost_wanted: int = 0
    ghost_lru_hits: int = 0
    ghost_slru_hits: int = 0
    ghost_lfu_hits: int = 0
    cache_victims: str = ""  # --cache-victims in force ("" where not reported)
    cross_evictions: int = 0  # evictions of another layer's entry by a request (a page move each)
    twin_misses: int = 0  # --cache-victims auto: the scope twin's misses on the same requests
    twin_cross_evictions: int = 0  # ... and its evictions of another layer's entry
    victims_switches: int = 0  # ... the times the chooser changed the live cache's scope
    release_s: float = 0.0  # moving or giving evicted pages back, on the eval thread (inside mgmt_s)
    release_lanes_s: float = 0.0  # ... on the worker lanes
    releases_deferred: int = 0  # evictions whose pages were given back off the read path
    releases_cancelled: int = 0  # ... kept instead: the entry was read again first
    pages_recycled: int = 0  # evictions whose pages moved under a read's slices (none released)
    rows_swapped: int = 0  # ... whose row went to a read of their own layer (--cache-victims layer)
    evict_waits: int = 0  # evictions that waited for their own read, still running, to end
    evict_wait_s: float = 0.0  # ... the eval thread's wait (inside mgmt_s)
    reads_orphaned: int = 0  # evictions left to their read's lane, which gave the pages back after
    orphans_cut: int = 0  # ... whose read stopped before its last projection
    bytes_landed: int = 0  # bytes the reads put in memory (bytes_read counts a read when planned;
    # one cancelled while still queued, or cut short, lands less; the fast path's, 0 in reference)
    bytes_in_place: int = 0  # ... of which read straight into their slices' pages (no copy, no repack)
    projection_waits: int = 0  # graph nodes that waited for one expert projection of their layer
    land_s: float = 0.0  # landing read bytes in their slices (memcpy, or llama.cpp's repack), any lane
    lane_cpu_s: float = 0.0  # the worker lanes' CPU time while reading (user + system): CPU the
    # compute threads lose where the lanes share their cores
    # the process's, not the streamer's (getrusage, every thread): what the read path costs
    # the kernel (a fresh page for each read that lands where no page was, syscalls)
    minor_faults: int = 0
    system_s: float = 0.0
    # decode routing (docs/read-ahead.md): slots are (token, layer, selected expert)
    decode_slots: int = 0
    predict_layers: tuple[tuple[int, int], ...] = ()  # per layer: (slots predicted, slots agreed)
    route_ahead_committed: int = 0  # layer calls whose selection was the committed ranking
    route_ahead_passed: int = 0  # layer calls that kept the router's own (no ranking ready)
    route_ahead_slots: int = 0
    route_ahead_agree: int = 0
    dropped: int = 0
    substituted: int = 0
    rank_s: float = 0.0  # ranking (router GEMV + top-k), on the worker or the eval thread
    rank_wait_s: float = 0.0  # the eval thread's wait for the worker's rankings
    rank_worker: bool = False  # the rankings were made on the worker thread
    issue_s: float = 0.0  # issuing a ranking's reads ahead
    watchdog_checks: int = 0
    watchdog_trips: int = 0
    predict_gate_open: int = 0  # --predict-prefetch auto: decode layer calls with the gate open
    predict_gate_closed: int = 0  # ... and closed (no prediction made nor read)

    @classmethod
    def of(cls, figures: Mapping[str, Any]) -> StreamCounters:
        """The counters among ``figures`` named as this class's fields (an engine's report:
        one name per counter, whatever else it reports beside them)."""
        names = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in figures.items() if key in names})

    def decisions(self) -> StreamCounters:
        """The counters the cache policy decides: timers and page-release mechanics zeroed
        (two executions of one policy must agree on these)."""
        return attrs.evolve(self, **_MECHANISM)  # type: ignore[arg-type]  # each zero keeps its field's type

    @property
    def predict_slots(self) -> int:
        return sum(slots for slots, _ in self.predict_layers)

    @property
    def predict_agree(self) -> int:
        return sum(agree for _, agree in self.predict_layers)

    def __sub__(self, before: StreamCounters) -> StreamCounters:
        """The activity between two snapshots (sizes are those of the later one)."""
        delta: dict[str, object] = {}
        for field in attrs.fields(StreamCounters):
            after, earlier = getattr(self, field.name), getattr(before, field.name)
            if field.name in _SIZES:
                delta[field.name] = after
            elif field.name == "predict_layers":
                delta[field.name] = _layer_delta(after, earlier)
            elif field.name == "stall_layers":
                pairs = zip(after, earlier, strict=True) if earlier else ((a, 0.0) for a in after)
                delta[field.name] = tuple(a - b for a, b in pairs)
            else:
                delta[field.name] = after - earlier
        return StreamCounters(**delta)  # type: ignore[arg-type]  # each field keeps its type

    @property
    def hit_pct(self) -> float:
        """Hit rate in percent; -1 when there was no request."""
        total = self.hits + self.misses
        return 100.0 * self.hits / total if total else -1.0

    @property
    def read_mib(self) -> float:
        return self.bytes_read / MIB

    def ghost_pcts(self) -> dict[str, float]:
        """Each ghost cache's hit rate in percent (adaptive); empty where none ran."""
        if self.ghost_wanted <= 0:
            return {}
        hits = {"lru": self.ghost_lru_hits, "slru": self.ghost_slru_hits, "lfu": self.ghost_lfu_hits}
        return {rule: 100.0 * n / self.ghost_wanted for rule, n in hits.items()}


@attrs.frozen
class StreamReport:
    """What streaming did during one generate (the ``BMOE_DONE`` streaming keys)."""

    prefill: StreamCounters
    decode: StreamCounters
    decode_steps: int  # decode steps the decode counters cover
    decode_wall_s: float
    expert_bytes: int = 0  # all routed experts of the model (0: not known)

    @property
    def prefill_passes(self) -> float | None:
        """How many times over the prefill read the model's experts (MiB read / expert
        MiB; about once per ubatch of a long prompt); None where the size is not known."""
        return self.prefill.bytes_read / self.expert_bytes if self.expert_bytes > 0 else None

    def per_token(self, seconds: float) -> float:
        return seconds / self.decode_steps if self.decode_steps > 0 else 0.0

    @property
    def io_s_tok(self) -> float:
        return self.per_token(self.decode.io_s)

    @property
    def stall_s_tok(self) -> float:
        return self.per_token(self.decode.stall_s)

    @property
    def mgmt_s_tok(self) -> float:
        return self.per_token(self.decode.mgmt_s)

    @property
    def compute_s_tok(self) -> float:
        """Wall time not spent waiting for reads nor managing the cache."""
        return max(0.0, self.per_token(self.decode_wall_s) - self.stall_s_tok - self.mgmt_s_tok)

    @property
    def read_mib_tok(self) -> float:
        return self.decode.read_mib / self.decode_steps if self.decode_steps > 0 else 0.0
