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

What else decides, each in its module: ``eviction="lfu"`` evicts the smallest decayed use
count first, the list and segments as they are (``use_counts``); ``"lru"`` caps the protected
segment at 0; ``"adaptive"`` feeds ghost caches of those rules and hands the victim choice
(``rule``) to the one whose ghost hits most (``ghost_caches``, ``rule_chooser``);
``victims="layer"`` evicts the missing layer's own entries first (``victims``); a scope twin
(``scope_twin``) runs the other scope beside it for ``--cache-victims auto``.

**A layer held whole** (``holds_layer``) needs nothing from a call: ``pass_layer`` counts it
in ``passed``, nothing else; with ``StreamConfig.pass_layers`` the engine does not even stop
the graph at its routing (no hits, use counts, recency or aging).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Literal

from bmoe.domain.streaming.cache_companions import companions
from bmoe.domain.streaming.cache_eviction import evict_until
from bmoe.domain.streaming.cache_invariants import check_arguments, check_policy
from bmoe.domain.streaming.cache_plans import CacheCounters, Entry, LayerPlan, PrefetchPlan
from bmoe.domain.streaming.cache_reads_ahead import plan_reads_ahead
from bmoe.domain.streaming.ghost_caches import Rule
from bmoe.domain.streaming.use_counts import DEFAULT_HALF_LIFE, UseCounts
from bmoe.domain.streaming.victims import VICTIMS, Victims, layer_first

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
        scope_twin: bool = False,
    ) -> None:
        check_arguments(budget_bytes, entry_bytes, n_expert, n_expert_used, eviction, EVICTIONS, victims)
        self.eviction = eviction
        self.victims = victims
        self.half_life = half_life
        n_moe = sum(1 for size in entry_bytes if size > 0)
        self._uses = UseCounts(half_life, n_moe)  # lfu's (and adaptive's: lfu may take charge)
        self._counting = eviction in ("lfu", "adaptive")
        self.rule: Rule = "slru" if eviction == "slru" else "lfu" if eviction == "lfu" else "lru"
        # adaptive's ghosts and chooser, the scope twin (``cache_companions``)
        self.ghosts, self.chooser, self.twin = companions(
            partial(
                ExpertCachePolicy, budget_bytes, entry_bytes, n_expert, n_expert_used, half_life=half_life
            ),
            eviction,
            victims,
            n_moe,
            scope_twin=scope_twin,
            window_tokens=window_tokens,
            margin_permille=margin_permille,
        )
        if self.chooser is not None:
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
        evicted = evict_until(self, 0, keep=frozenset())
        self._fit_kept(self.kept_cap())
        if self.ghosts is not None:
            self.ghosts.set_budget(budget_bytes)
        if self.twin is not None:
            self.twin.cache.set_budget(budget_bytes)
        return evicted

    def evict_all(self) -> tuple[Entry, ...]:
        """Evict every resident entry in eviction order and return them."""
        if self.ghosts is not None:
            self.ghosts.evict_all()
        if self.twin is not None:
            self.twin.cache.evict_all()
        return evict_until(self, 0, keep=frozenset(), everything=True)

    def set_victims(self, victims: Victims) -> None:
        """Whose entries a miss evicts from the next request on (the ghosts too; the twin, if
        any, the other scope)."""
        if victims not in VICTIMS:
            raise ValueError(f"victims must be one of {', '.join(VICTIMS)}, not {victims!r}")
        self.victims = victims
        for ghost in self.ghosts.caches.values() if self.ghosts is not None else ():
            ghost.set_victims(victims)
        if self.twin is not None:
            self.twin.set_victims(victims)

    def take_rule(self, rule: Rule) -> None:
        """The rule in charge from the next eviction on (the protected segment refitted)."""
        if rule != self.rule:
            self.rule = rule
            self._fit_kept(self.kept_cap())

    def twin_counters(self) -> dict[str, int]:
        """The scope twin's hits, misses and evictions of another layer's entry ({}: none)."""
        return {} if self.twin is None else self.twin.counters()

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
        evictions = evict_until(self, len(loads) * size, keep=frozenset(wanted), first=first) if loads else ()
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
        c.cross_evictions += sum(1 for entry in evictions if entry[0] != layer)
        if decode and self._counting:
            self._uses.tick()
        if self.ghosts is not None and self.chooser is not None:  # adaptive
            n_wanted, ghost_hits = self.ghosts.request(layer, routed, n_tokens, decode)
            if decode and self.chooser.observe(n_wanted, ghost_hits):
                self.take_rule(self.chooser.rule)  # another victim choice from the next eviction on
        if self.twin is not None:
            self.twin.request(layer, routed, n_tokens, decode, self.rule)
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

    def check_valid(self) -> None:
        """Its invariants hold (``cache_invariants``), or AssertionError."""
        check_policy(self)
