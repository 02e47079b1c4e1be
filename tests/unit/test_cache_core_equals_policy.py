"""The C cache core (what the fast path runs) follows the domain policy decision for
decision: a hypothesis state machine drives both with the same random requests (prefill
batches, and decode requests of a few ids, whose hits fill the protected segment), budget
changes, evict-alls and reads ahead (prefetch) over random per-layer entry sizes, with k
given or taken from the decode requests, under every eviction (SLRU, LFU with a short
half-life so the counts halve often, plain LRU, and adaptive with a window of one or two
tokens and margins from none to large, so the rule in charge switches often), and compares
every plan, every counter, the eviction order, the protected segment and every use count
after each step, and under adaptive the rule in charge, the count of switches (so every
switch, at the step it happens), each ghost's hits and each ghost's eviction order.

The machine also plays the read lanes: every entry read ahead (a prefetch, or a usage
profile's warm-up) is in flight until a ``complete`` step lands it, in any order, or a
request adopts it (the engine waits for it). A request may compute only on entries whose
reads have landed: every hit still in flight must be in the plan's ``adopted``, and a layer
passed whole has no read in flight (the reference path passes without waiting).

CI runs the default profile (``BMOE_CORE_EXAMPLES`` state machines, 300 by default, a few
seconds); a longer run: ``BMOE_CORE_EXAMPLES=2000 pytest tests/unit/test_cache_core_equals_policy.py``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bmoe.cext.cache_core import ExpertCacheCore
from bmoe.domain.streaming import ExpertCachePolicy
from bmoe.domain.streaming.cache_policy import Entry, Eviction, LayerPlan
from bmoe.domain.streaming.victims import Victims

N_LAYER = 5
N_EXPERT = 16
EXAMPLES = int(os.environ.get("BMOE_CORE_EXAMPLES", "300"))


class CoreAgainstPolicy(RuleBasedStateMachine):
    policy: ExpertCachePolicy
    core: ExpertCacheCore

    @initialize(
        sizes=st.lists(st.sampled_from([0, 1, 3, 7, 7680]), min_size=N_LAYER, max_size=N_LAYER),
        budget_entries=st.integers(0, 40),
        unit=st.sampled_from([1, 7, 7680]),
        k=st.sampled_from([0, 0, 1, 2, 3]),
        eviction=st.sampled_from(["slru", "lfu", "lfu", "lru", "adaptive", "adaptive"]),
        half_life=st.sampled_from([1, 2, 5, 64]),
        window_tokens=st.sampled_from([1, 2]),
        margin_permille=st.sampled_from([0, 10, 200]),
        victims=st.sampled_from(["global", "layer", "layer"]),
        scope_twin=st.booleans(),
    )
    def start(
        self,
        sizes: list[int],
        budget_entries: int,
        unit: int,
        k: int,
        eviction: Eviction,
        half_life: int,
        window_tokens: int,
        margin_permille: int,
        victims: Victims,
        scope_twin: bool,
    ) -> None:
        if not any(sizes):
            sizes = [*sizes[:-1], 5]
        self.sizes = sizes
        budget = budget_entries * unit
        chooser = {
            "window_tokens": window_tokens,
            "margin_permille": margin_permille,
            "scope_twin": scope_twin,
        }
        self.policy = ExpertCachePolicy(
            budget, sizes, N_EXPERT, k, eviction=eviction, half_life=half_life, victims=victims, **chooser
        )
        self.core = ExpertCacheCore(
            budget, sizes, N_EXPERT, k, eviction=eviction, half_life=half_life, victims=victims, **chooser
        )
        self.in_flight: list[Entry] = []  # read ahead, not landed yet, in issue order

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        ids=st.lists(st.integers(0, N_EXPERT - 1), min_size=1, max_size=24),
        n_tokens=st.sampled_from([1, 2, 6]),
    )
    def request(self, layer: int, ids: list[int], n_tokens: int) -> None:
        self._same_plan(layer, ids, n_tokens)

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        ids=st.lists(st.integers(0, N_EXPERT - 1), min_size=2, max_size=12),
        n_seq=st.sampled_from([2, 4]),
    )
    def batched_decode(self, layer: int, ids: list[int], n_seq: int) -> None:
        """A decode step of several sequences: the union of their experts, as decode."""
        self._same_plan(layer, ids, n_seq, decode=True)

    def _same_plan(self, layer: int, ids: list[int], n_tokens: int, decode: bool | None = None) -> None:
        try:
            plan = self.policy.request(layer, ids, n_tokens, decode=decode)
        except ValueError:
            with pytest.raises(ValueError):
                self.core.request(layer, ids, n_tokens, decode=decode)
            return
        assert self.core.request(layer, ids, n_tokens, decode=decode) == (
            plan.hits,
            plan.evictions,
            plan.loads,
            plan.adopted,
        )
        unsafe = [e for e in plan.hits if e in self.in_flight and e not in plan.adopted]
        assert not unsafe, f"computed on {unsafe} while their reads ahead were in flight"
        self._landed([*plan.adopted, *plan.evictions])  # waited for; evicted: cancelled

    def _landed(self, entries: Iterable[Entry]) -> None:
        gone = set(entries)
        self.in_flight = [e for e in self.in_flight if e not in gone]

    @rule(pick=st.integers(0, 10**6))
    def complete(self, pick: int) -> None:
        """One read ahead lands, any of those in flight."""
        if self.in_flight:
            del self.in_flight[pick % len(self.in_flight)]

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        ids=st.lists(st.integers(0, N_EXPERT - 1), min_size=1, max_size=3),
    )
    def decode(self, layer: int, ids: list[int]) -> None:
        """One token's routing: hits promote, so the protected segment fills and demotes."""
        self._same_plan(layer, ids, 1)

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        ids=st.lists(st.integers(0, N_EXPERT - 1), min_size=1, max_size=10),
        hot=st.booleans(),
        warm=st.booleans(),
    )
    def prefetch(self, layer: int, ids: list[int], hot: bool, warm: bool) -> None:
        try:
            plan = self.policy.prefetch(layer, ids, hot=hot, warm=warm)
        except ValueError:
            with pytest.raises(ValueError):
                self.core.prefetch(layer, ids, hot=hot, warm=warm)
            return
        assert self.core.prefetch(layer, ids, hot=hot, warm=warm) == (plan.evictions, plan.issued)
        self._landed(plan.evictions)
        self.in_flight += plan.issued

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        ids=st.lists(st.integers(0, N_EXPERT - 1), min_size=1, max_size=N_EXPERT),
    )
    def warm_up(self, layer: int, ids: list[int]) -> None:
        """A usage profile's warm-up: a committed set, not a prefetch (its first use is a
        plain hit), its reads in flight until they land or a request adopts them."""
        self.prefetch(layer, ids, hot=True, warm=True)

    @rule(layer=st.integers(0, N_LAYER - 1))
    def pass_layer(self, layer: int) -> None:
        """A layer held whole passes its call (nothing else changes), in both alike."""
        assert self.core.holds_layer(layer) == self.policy.holds_layer(layer)
        passed = self.policy.pass_layer(layer)
        assert self.core.pass_layer(layer) == passed
        assert not passed or all(e[0] != layer for e in self.in_flight), "passed with a read in flight"

    @rule(
        layer=st.integers(0, N_LAYER - 1),
        n_tokens=st.sampled_from([1, 6]),
    )
    def whole_layer(self, layer: int, n_tokens: int) -> None:
        """A call routing every expert of the layer (a prefill's): the layer may end held."""
        self._same_plan(layer, list(range(N_EXPERT)), n_tokens)

    @rule(layer=st.integers(0, N_LAYER - 1), bad=st.sampled_from([-1, N_EXPERT, 10**6]))
    def request_out_of_range(self, layer: int, bad: int) -> None:
        with pytest.raises(ValueError):
            self.policy.request(layer, [0, bad])
        with pytest.raises(ValueError):
            self.core.request(layer, [0, bad])

    @rule(budget_entries=st.integers(0, 40), unit=st.sampled_from([1, 7, 7680]))
    def set_budget(self, budget_entries: int, unit: int) -> None:
        budget = budget_entries * unit
        evicted = self.policy.set_budget(budget)
        assert self.core.set_budget(budget) == evicted
        self._landed(evicted)

    @rule(victims=st.sampled_from(["global", "layer"]))
    def set_victims(self, victims: Victims) -> None:
        """--cache-victims auto's switch: the live scope changes, the twin takes the other."""
        self.policy.set_victims(victims)
        self.core.set_victims(victims)
        assert self.core.victims == victims

    @rule()
    def evict_all(self) -> None:
        evicted = self.policy.evict_all()
        assert self.core.evict_all() == evicted
        self._landed(evicted)

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "policy"):
            return
        c = self.policy.counters
        assert self.core.counters() == {
            "requests": c.requests,
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "rereads": c.rereads,
            "bytes_read": c.bytes_read,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_hits": c.prefetch_hits,
            "prefetch_wasted": c.prefetch_wasted,
            "warm_issued": c.warm_issued,
            "passed": c.passed,
            "cross_evictions": c.cross_evictions,
        }
        assert self.core.twin_counters() == self.policy.twin_counters()
        if self.policy.twin is not None:
            assert isinstance(self.policy.twin.cache, ExpertCachePolicy)
            assert self.core.twin_resident() == self.policy.twin.cache.resident()
        assert self.core.resident() == self.policy.resident()
        assert self.core.kept() == self.policy.kept()
        assert self.core.kept_bytes == self.policy.kept_bytes
        self.core.check_valid()
        assert self.core.resident_bytes == self.policy.resident_bytes
        assert self.core.budget_bytes == self.policy.budget_bytes
        assert all(
            self.core.uses(layer, e) == self.policy.uses(layer, e)
            for layer in range(N_LAYER)
            for e in range(N_EXPERT)
        )
        self.policy.check_valid()
        assert self.core.rule == self.policy.rule
        if self.policy.ghosts is None or self.policy.chooser is None:
            assert self.core.ghost_hits() == (0, {})
            return
        assert self.core.switches == self.policy.chooser.switches
        assert self.core.ghost_hits() == (self.policy.ghosts.wanted, self.policy.ghosts.hits)
        for name, ghost in self.policy.ghosts.caches.items():
            assert isinstance(ghost, ExpertCachePolicy)
            assert self.core.ghost_resident(name) == ghost.resident()


CoreAgainstPolicy.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=60, deadline=None)
TestCoreAgainstPolicy = CoreAgainstPolicy.TestCase


def test_a_mutated_core_would_be_caught() -> None:
    """The comparison is not vacuous: a policy with another eviction order disagrees."""
    policy = ExpertCachePolicy(2, [1, 1], 4)
    core = ExpertCacheCore(1, [1, 1], 4)  # a different budget stands in for a bug
    for layer, ids in [(0, [0]), (1, [1]), (0, [2])]:
        plans = core.request(layer, ids), policy.request(layer, ids)
    assert plans[0] != (plans[1].hits, plans[1].evictions, plans[1].loads, plans[1].adopted)


def _evictions(plan: LayerPlan | tuple[tuple[tuple[int, int], ...], ...]) -> tuple[tuple[int, int], ...]:
    return plan.evictions if isinstance(plan, LayerPlan) else plan[1]


@pytest.mark.parametrize("make", [ExpertCachePolicy, ExpertCacheCore])
def test_lfu_evicts_the_fewest_uses_where_slru_evicts_the_least_recent(make: type) -> None:
    """Expert 0 used three times, then 1 twice (which demotes 0 from the protected segment):
    SLRU evicts 0 for 2, LFU evicts 1 (two uses against three)."""
    for eviction, victim in (("slru", (0, 0)), ("lfu", (0, 1))):
        cache = make(2, [1], 8, 1, eviction=eviction)
        for ids in ([0], [0], [0], [1], [1]):
            cache.request(0, ids)
        assert _evictions(cache.request(0, [2])) == (victim,), eviction


@pytest.mark.parametrize("make", [ExpertCachePolicy, ExpertCacheCore])
def test_lfu_counts_halve_every_half_life_of_decode_tokens(make: type) -> None:
    cache = make(4, [1, 0, 1], 8, 1, eviction="lfu", half_life=2)  # two MoE layers: 4 requests
    for ids in ([0], [0], [0]):
        cache.request(0, ids)
    cache.request(2, [5], n_tokens=6)  # a prefill counts a use, and no tick
    assert cache.uses(0, 0) == 3 and cache.uses(2, 5) == 1
    cache.request(2, [5])  # the fourth decode request: halved after it
    assert cache.uses(0, 0) == 1 and cache.uses(2, 5) == 1


@pytest.mark.parametrize("make", [ExpertCachePolicy, ExpertCacheCore])
@pytest.mark.parametrize("eviction", ["lru", "slru", "lfu", "adaptive"])
def test_victims_from_the_missing_layer_where_its_share_holds_two_tokens(make: type, eviction: str) -> None:
    """Two layers of four experts, k 1, four entries: each layer's share is 2 = two tokens'
    top-k, so a miss of layer 1 evicts layer 1's entry where the global choice takes layer 0's."""
    plans = {}
    for victims in ("global", "layer"):
        cache = make(4, [1, 1], 4, 1, eviction=eviction, victims=victims)
        for layer, e in ((0, 0), (1, 0), (0, 1), (1, 1)):
            cache.request(layer, [e])
        plans[victims] = cache.request(1, [2])
    evictions = {v: (p.evictions if isinstance(p, LayerPlan) else p[1]) for v, p in plans.items()}
    assert evictions["global"] == ((0, 0),) and evictions["layer"] == ((1, 0),)
    small = make(3, [1, 1], 4, 1, eviction=eviction, victims="layer")  # share 1: below two tokens
    for layer, e in ((0, 0), (1, 0), (0, 1)):
        small.request(layer, [e])
    plan = small.request(1, [2])
    assert (plan.evictions if isinstance(plan, LayerPlan) else plan[1]) == ((0, 0),)


@pytest.mark.parametrize("eviction", ["adaptive", "lfu", "slru", "lru"])
def test_the_scope_twin_runs_the_other_scope_under_the_rule_in_charge(eviction: str) -> None:
    """``--cache-victims auto``'s twin, in the core as in the policy: fed every request, it
    follows the adaptive chooser's switches (window 1, margin 0: it switches often) and takes
    the other scope when the live cache changes its own."""
    rng = random.Random(7)
    routing = [[rng.sample(range(16), 2) for _ in range(3)] for _ in range(300)]
    runs = []
    for make in (ExpertCachePolicy, ExpertCacheCore):
        cache = make(
            24, [1, 1, 1], 16, 2, eviction=eviction, window_tokens=1, margin_permille=0, scope_twin=True
        )
        seen = []
        for t, token in enumerate(routing):
            if t in (100, 200):
                cache.set_victims("layer" if t == 100 else "global")
            for layer, ids in enumerate(token):
                cache.request(layer, ids)
            seen.append((cache.twin_counters(), cache.rule, cache.victims))
        twin = cache.twin_resident() if isinstance(cache, ExpertCacheCore) else cache.twin.cache.resident()
        runs.append((seen, twin, cache.resident()))
    assert runs[0] == runs[1]
    counts = runs[0][0]
    assert counts[99][0]["cross_evictions"] < counts[99][0]["misses"]  # the twin took layer victims first
    if eviction == "adaptive":
        assert len({rule for _, rule, _ in counts}) > 1  # the chooser switched: the twin followed
