"""The expert cache policy: a segmented LRU (SLRU) over (layer, expert) entries with a byte
budget.

This is the reference the C engine (``bmoe.cext.expert_stream``) follows decision for
decision; tests drive both with the same requests and compare every plan and counter.

Per MoE layer the engine asks ``request(layer, experts)`` with the experts the router
selected (for a batch of tokens: every token's, in token order). The plan it returns says,
in order of execution: which resident entries are hits, which entries are evicted (from the
head of the eviction order, never one this layer wants) until the misses fit in the budget,
and which entries must be loaded (in wanted order). When the wanted entries alone exceed
the budget, everything else is evicted and the budget is exceeded for that request: the
graph needs those experts now.

Two segments, kept as one list that is the eviction order: *probation* (oldest first), then
*protected* (oldest first). Every load and every read ahead enters probation. A *decode hit*
(a request of one token finding resident an entry that a request used before) moves the
entry to the protected segment's most recent end: an expert decode comes back to outlives
one used once. Not promoted: the first use of an entry read ahead (it stands for the miss it
saved; it is touched to probation's most recent end) and a prefill's hits (a prompt is a
scan; below). The protected segment holds at most the budget less one *token cycle*
(``n_expert_used`` entries of every MoE layer: the room decode's own misses need; never
below 0); beyond that its oldest entries move back to probation's most recent end (their
place in the list does not change). With a cap of 0 the policy is a plain LRU.
``n_expert_used`` 0 (the default): the most distinct experts one decode request has routed
so far (a top-k router's k from the first decode request on).

A prompt must not flush decode's cache (scan resistance): a request of several tokens (a
prefill ubatch) that routes more experts than the layer's *share* of the budget (the budget in
entries of that layer divided by the number of MoE layers) keeps only its ``share``
most-routed experts hot (ties: first routed first); its other hits stay where they are and
its other loads enter at the cold end (the list's head), where the next layers' loads evict
them first. After a long prompt the cache then holds each layer's most-used experts, not the
last layers' whole sets. A prefill's hot hits are touched to the most recent end of their
own segment (a protected entry stays protected; nothing a prompt routes is promoted); its
hot loads enter probation's most recent end. A decode request (one token) keeps all hot.

An entry holds all projections of one expert of one layer; its size is the layer's
(``entry_bytes[layer]``): real Q4_K_M/Q5_K_M files store some layers' expert projections at
a higher precision than others.

Reads ahead (``prefetch``: guesses, committed routings, a usage profile's warm-up) follow
their own rules (``bmoe.domain.streaming.cache_reads_ahead``).

**Eviction by frequency** (``eviction="lfu"``, ``--cache-policy lfu``): the list, its
segments and every rule above stay as they are; only the choice of what to evict changes:
the smallest decayed use count first (``bmoe.domain.streaming.use_counts``). ``"lru"``: the
protected segment's cap is 0 (a plain LRU). ``"adaptive"``: ghost caches of those three
rules (``ghost_caches``) are fed every request, and the rule chooser (``rule_chooser``)
hands the victim choice (``rule``) to the one whose ghost hits most on the routing met.

**Victims from the layer that misses** (``victims="layer"``, ``bmoe.domain.streaming.victims``):
where each layer's share of the budget (``share``) holds two tokens' top-k, a request's
misses evict the layer's own entries first (the rule's choice among them: the head of the
list among the layer's, or its fewest uses), the others only when the layer has none left
to give.

**A layer held whole** (``holds_layer``: every expert resident, none waiting for its first
use after a read ahead) needs nothing from a call: ``pass_layer`` counts the call in
``passed`` and changes nothing else; with ``StreamConfig.pass_layers`` on, the engine
passes such calls without stopping llama.cpp's graph at the layer's routing (so their
routing is not seen: no hits, no use counts, no recency, no aging), and a cache that holds
every expert decodes without a stop.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from typing import Literal

from bmoe.domain.streaming.cache_plans import CacheCounters, Entry, LayerPlan, PrefetchPlan
from bmoe.domain.streaming.cache_reads_ahead import plan_reads_ahead
from bmoe.domain.streaming.ghost_caches import GhostCaches, Rule
from bmoe.domain.streaming.rule_chooser import RuleChooser
from bmoe.domain.streaming.use_counts import DEFAULT_HALF_LIFE, UseCounts
from bmoe.domain.streaming.victims import VICTIMS, Victims, layer_first, layer_victim

__all__ = [
    "DEFAULT_EVICTION",
    "DEFAULT_HALF_LIFE",
    "EVICTIONS",
    "CacheCounters",
    "Entry",
    "Eviction",
    "ExpertCachePolicy",
    "LayerPlan",
    "PrefetchPlan",
]

Eviction = Literal["slru", "lfu", "lru", "adaptive"]
EVICTIONS: tuple[Eviction, ...] = ("slru", "lfu", "lru", "adaptive")
DEFAULT_EVICTION: Eviction = "adaptive"
"""What streaming uses unless told (``StreamConfig.eviction``, ``--cache-policy``): within
0.3 points of the best fixed rule on every routing regime replayed, and above each fixed
rule where the routing changes (``python -m bmoe.bench.replay``, docs/benchmarks.md). The
policy class itself defaults to SLRU, the rule its docstring starts from."""


class ExpertCachePolicy:
    """``entry_bytes[layer]``: the size of one entry of that layer (0: no routed experts);
    ``n_expert_used``: experts per token (the protected segment's cap leaves one token's
    worth of room), 0 to take it from the decode requests; ``eviction``: what goes first
    (``"slru"``: the list's head; ``"lfu"``: the smallest decayed use count, counts halved
    every ``half_life`` decode tokens; ``"lru"``: the head, no protected segment;
    ``"adaptive"``: the rule whose ghost hits most, ``rule`` the one in charge, chosen over
    windows of ``window_tokens`` decode tokens by ``margin_permille``: ``rule_chooser``)."""

    def __init__(
        self,
        budget_bytes: int,
        entry_bytes: Sequence[int],
        n_expert: int,
        n_expert_used: int = 0,
        *,
        eviction: Eviction = "slru",
        half_life: int = DEFAULT_HALF_LIFE,
        window_tokens: int | None = None,
        margin_permille: int | None = None,
        victims: Victims = "global",
    ) -> None:
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        if n_expert <= 0 or any(b < 0 for b in entry_bytes):
            raise ValueError("n_expert must be > 0 and entry sizes >= 0")
        if n_expert_used < 0:
            raise ValueError("n_expert_used must be >= 0 (0: from the decode requests)")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, not {eviction!r}")
        if victims not in VICTIMS:
            raise ValueError(f"victims must be one of {', '.join(VICTIMS)}, not {victims!r}")
        self.eviction = eviction
        self.victims = victims
        self.half_life = half_life
        n_moe = sum(1 for size in entry_bytes if size > 0)
        self._uses = UseCounts(half_life, n_moe)  # lfu's (and adaptive's: lfu may take charge)
        self._counting = eviction in ("lfu", "adaptive")
        self.ghosts: GhostCaches | None = None
        self.chooser: RuleChooser | None = None
        self.rule: Rule = "slru" if eviction == "slru" else "lfu" if eviction == "lfu" else "lru"
        if eviction == "adaptive":
            self.ghosts = GhostCaches(
                lambda rule: ExpertCachePolicy(
                    budget_bytes,
                    entry_bytes,
                    n_expert,
                    n_expert_used,
                    eviction=rule,
                    half_life=half_life,
                    victims=victims,
                )
            )
            self.chooser = RuleChooser(n_moe, window_tokens=window_tokens, margin_permille=margin_permille)
            self.rule = self.chooser.rule
        self.budget_bytes = budget_bytes
        self.entry_bytes = tuple(entry_bytes)
        self.n_expert = n_expert
        self.n_expert_used = n_expert_used
        self.resident_bytes = 0
        self.kept_bytes = 0  # the protected segment's
        self._probation: OrderedDict[Entry, None] = OrderedDict()  # oldest first
        self._kept: OrderedDict[Entry, None] = OrderedDict()  # the protected segment, oldest first
        self._k_seen = 0  # the most distinct experts a decode request routed
        self._evicted_once: set[Entry] = set()
        self._prefetched: set[Entry] = set()  # issued ahead, not yet routed to
        self._warmed: set[Entry] = set()  # issued by a warm-up, not yet routed to
        self._protected: frozenset[Entry] = frozenset()  # the last request's entries (in use)
        self._last_request_bytes = 0
        self.counters = CacheCounters()

    def resident(self) -> list[Entry]:
        """Resident entries in eviction order: probation oldest first, then protected."""
        return [*self._probation, *self._kept]

    def kept(self) -> list[Entry]:
        """The protected segment's entries, oldest first (the tail of ``resident()``)."""
        return list(self._kept)

    def is_resident(self, entry: Entry) -> bool:
        return entry in self._probation or entry in self._kept

    def holds_layer(self, layer: int) -> bool:
        """Whether every expert of ``layer`` is resident and none waits for its first use
        after a read ahead (whose read may still be running): a call of the layer, whatever
        it routes to, needs nothing."""
        if not 0 <= layer < len(self.entry_bytes) or self.entry_bytes[layer] <= 0:
            return False
        entries = ((layer, e) for e in range(self.n_expert))
        return all(self.is_resident(entry) and not self._read_ahead(entry) for entry in entries)

    def _read_ahead(self, entry: Entry) -> bool:
        """Read ahead (prefetched or warmed) and not routed to since: its read may still
        be in flight."""
        return entry in self._prefetched or entry in self._warmed

    def pass_layer(self, layer: int) -> bool:
        """A call of ``layer`` that the layer, held whole (``holds_layer``), serves without a
        request: counted in ``passed``, nothing else changes (no hits, no use counts, no
        recency, no aging): the engine does not even stop the graph to learn its routing.
        False, and nothing counted, where the layer is not held whole (then ``request``)."""
        if not self.holds_layer(layer):
            return False
        self.counters.passed += 1
        return True

    def kept_cap(self) -> int:
        """The protected segment's byte cap: the budget less one token cycle (``k`` entries
        of every MoE layer), never below 0."""
        k = self.n_expert_used or self._k_seen
        return 0 if self.rule == "lru" else max(0, self.budget_bytes - k * sum(self.entry_bytes))

    def set_budget(self, budget_bytes: int) -> tuple[Entry, ...]:
        """Change the budget; evicts (eviction order) down to it and returns what it evicted."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        self.budget_bytes = budget_bytes
        evicted = self._evict_until(0, keep=frozenset())
        self._fit_kept(self.kept_cap())
        if self.ghosts is not None:
            self.ghosts.set_budget(budget_bytes)
        return evicted

    def evict_all(self) -> tuple[Entry, ...]:
        """Evict every resident entry in eviction order and return them."""
        if self.ghosts is not None:
            self.ghosts.evict_all()
        return self._evict_until(0, keep=frozenset(), everything=True)

    def share(self, layer: int) -> int:
        """How many of a prefill request's experts stay hot at ``layer`` (at least 1)."""
        n_moe = sum(1 for size in self.entry_bytes if size > 0)
        return max(1, self.budget_bytes // self.entry_bytes[layer] // max(1, n_moe))

    def layer_first(self, layer: int) -> bool:
        """Whether a miss of ``layer`` evicts the layer's own entries first (module
        docstring, ``victims.layer_first``; k given, or seen in a decode request)."""
        k = self.n_expert_used or self._k_seen
        return layer_first(self.victims, k, self.share(layer))

    def request(
        self, layer: int, experts: Iterable[int], n_tokens: int = 1, decode: bool | None = None
    ) -> LayerPlan:
        """Plan one MoE layer call of ``n_tokens`` tokens (``experts``: every token's routed
        ids, repeats included). ``decode``: True for a decode step of several sequences (one
        token each): it counts as decode (hits promote, every expert stays hot), not as a
        prefill's scan; ``None``: decode exactly when it is one token. Raises ``ValueError``
        for a layer without experts or an expert id out of range (the state is then
        unchanged)."""
        routed = [int(e) for e in experts]
        ids = self._checked_ids(layer, routed)
        size = self.entry_bytes[layer]
        wanted = [(layer, e) for e in ids]
        decode = n_tokens <= 1 if decode is None else decode
        hot = set(wanted)
        if not decode and len(ids) > self.share(layer):
            counts = Counter(routed)
            ranked = sorted(range(len(ids)), key=lambda i: (-counts[ids[i]], i))
            hot = {wanted[i] for i in ranked[: self.share(layer)]}
        if self._counting:
            self._uses.add(wanted)
        hits = tuple(e for e in wanted if self.is_resident(e))
        loads = tuple(e for e in wanted if not self.is_resident(e))
        adopted = tuple(e for e in hits if self._read_ahead(e))
        prefetch_hits = tuple(e for e in adopted if e in self._prefetched)
        self._prefetched.difference_update(adopted)
        self._warmed.difference_update(adopted)
        self._protected = frozenset(wanted)
        cap = 0
        if decode:
            if n_tokens <= 1:  # one token's top-k, not a step's union
                self._k_seen = max(self._k_seen, len(ids))
            cap = self.kept_cap()
            self._fit_kept(cap)
        for entry in hits:
            if decode and entry not in prefetch_hits:  # a warmed entry is a plain hit
                self._promote(entry)
                self._fit_kept(cap)
            elif entry in hot:
                self._touch(entry)
        first = layer if self.layer_first(layer) else None
        evictions = self._evict_until(len(loads) * size, keep=frozenset(wanted), first=first) if loads else ()
        if loads:  # only a request that loads evicts: the budget may be exceeded by it alone
            self._last_request_bytes = len(wanted) * size
        for entry in loads:
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._probation[entry] = None
            if entry not in hot:
                self._probation.move_to_end(entry, last=False)  # the cold end
        self.resident_bytes += len(loads) * size
        c = self.counters
        c.requests += 1
        c.hits += len(hits)
        c.misses += len(loads)
        c.bytes_read += len(loads) * size
        c.prefetch_hits += len(prefetch_hits)
        if decode and self._counting:
            self._uses.tick()
        if self.ghosts is not None and self.chooser is not None:  # adaptive
            n_wanted, ghost_hits = self.ghosts.request(layer, routed, n_tokens, decode)
            if decode and self.chooser.observe(n_wanted, ghost_hits):
                self.rule = self.chooser.rule  # another victim choice from the next eviction on
                self._fit_kept(self.kept_cap())
        return LayerPlan(
            layer=layer,
            hits=hits,
            evictions=evictions,
            loads=loads,
            adopted=adopted,
        )

    def prefetch(
        self, layer: int, experts: Iterable[int], *, hot: bool = False, warm: bool = False
    ) -> PrefetchPlan:
        """Plan reads ahead of need for ``layer`` (``cache_reads_ahead``): ``hot`` for a
        committed routing, ``warm`` for a usage profile's warm-up. Raises ``ValueError``
        like ``request`` (the state is then unchanged)."""
        return plan_reads_ahead(self, layer, experts, hot=hot, warm=warm)

    def _checked_ids(self, layer: int, experts: Iterable[int]) -> list[int]:
        if not 0 <= layer < len(self.entry_bytes) or self.entry_bytes[layer] == 0:
            raise ValueError(f"layer {layer} has no routed experts")
        ids = list(dict.fromkeys(int(e) for e in experts))
        bad = [e for e in ids if not 0 <= e < self.n_expert]
        if bad:
            raise ValueError(f"expert id {bad[0]} out of range [0, {self.n_expert}) at layer {layer}")
        return ids

    def _touch(self, entry: Entry) -> None:
        """To the most recent end of its own segment."""
        if entry in self._kept:
            self._kept.move_to_end(entry)
        else:
            self._probation.move_to_end(entry)

    def _promote(self, entry: Entry) -> None:
        """To the protected segment's most recent end."""
        if entry in self._kept:
            self._kept.move_to_end(entry)
            return
        del self._probation[entry]
        self._kept[entry] = None
        self.kept_bytes += self.entry_bytes[entry[0]]

    def _fit_kept(self, cap: int) -> None:
        """Demote the protected segment's oldest entries (to probation's most recent end,
        their place in the eviction order) until it holds at most ``cap`` bytes."""
        while self.kept_bytes > cap:
            entry, _ = self._kept.popitem(last=False)
            self._probation[entry] = None
            self.kept_bytes -= self.entry_bytes[entry[0]]

    def _evict(self, entry: Entry) -> None:
        if entry in self._kept:
            del self._kept[entry]
            self.kept_bytes -= self.entry_bytes[entry[0]]
        else:
            del self._probation[entry]
        self.resident_bytes -= self.entry_bytes[entry[0]]
        self._evicted_once.add(entry)
        self.counters.evictions += 1
        if entry in self._prefetched:
            self._prefetched.discard(entry)
            self.counters.prefetch_wasted += 1
        self._warmed.discard(entry)

    def uses(self, layer: int, expert: int) -> int:
        """The entry's decayed use count (``lfu`` and ``adaptive``; 0 under the others)."""
        return self._uses[(layer, expert)]

    def _evict_until(
        self, incoming: int, keep: frozenset[Entry], everything: bool = False, first: int | None = None
    ) -> tuple[Entry, ...]:
        """Evict until ``incoming`` more bytes fit (``everything``: all), never an entry of
        ``keep``: from the list's head (slru, or everything), or the smallest use count
        first, the list's order among equals (lfu); layer ``first``'s entries before any
        other's (``layer_first``)."""
        evicted: list[Entry] = []
        while first is not None and not everything and self.resident_bytes + incoming > self.budget_bytes:
            victim = layer_victim(self.resident(), first, keep, self._uses if self.rule == "lfu" else None)
            if victim is None:
                break
            self._evict(victim)
            evicted.append(victim)
        if self.rule == "lfu" and not everything:
            while self.resident_bytes + incoming > self.budget_bytes:
                victim = self._uses.fewest(self.resident(), keep)
                if victim is None:
                    break
                self._evict(victim)
                evicted.append(victim)
            return tuple(evicted)
        for entry in self.resident():
            if not everything and self.resident_bytes + incoming <= self.budget_bytes:
                break
            if entry in keep:
                continue
            self._evict(entry)
            evicted.append(entry)
        return tuple(evicted)

    def check_valid(self) -> None:
        """Invariants: sizes and counters add up; the budget holds unless the last request
        that loaded needed more than it; the protected segment is within its cap and holds
        no entry read ahead and not yet used."""
        c = self.counters
        resident = self.resident()
        assert len(set(resident)) == len(resident)
        assert self.resident_bytes == sum(self.entry_bytes[layer] for layer, _ in resident)
        assert self.kept_bytes == sum(self.entry_bytes[layer] for layer, _ in self._kept)
        assert self.kept_bytes <= self.kept_cap()
        assert not self._prefetched & self._kept.keys()
        assert c.misses + c.prefetch_issued + c.warm_issued - c.evictions == len(resident)
        assert self._prefetched <= set(resident)
        assert self._warmed <= set(resident)
        assert not self._warmed & self._prefetched
        assert not self._warmed & self._kept.keys()
        assert c.prefetch_hits + c.prefetch_wasted + len(self._prefetched) == c.prefetch_issued
        assert c.rereads <= c.misses + c.prefetch_issued + c.warm_issued
        assert c.bytes_read >= self.resident_bytes
        assert all(self.entry_bytes[layer] > 0 and 0 <= e < self.n_expert for layer, e in resident)
        assert self.resident_bytes <= max(self.budget_bytes, self._last_request_bytes)
