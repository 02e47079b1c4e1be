"""The expert cache policy against a plain model, with its invariants checked."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.domain.streaming import ExpertCachePolicy, PrefetchPlan


def test_hits_touch_misses_load_and_the_oldest_unneeded_entry_goes_first() -> None:
    lru = ExpertCachePolicy(budget_bytes=3 * 10, entry_bytes=[10, 10], n_expert=8)
    assert lru.request(0, [1, 2]).loads == ((0, 1), (0, 2))
    assert lru.request(1, [1]).loads == ((1, 1),)
    out = lru.request(0, [2, 3])  # (0,2) hit; (0,1) is the oldest not needed
    assert (out.hits, out.loads, out.evictions) == (((0, 2),), ((0, 3),), ((0, 1),))
    assert lru.resident() == [(1, 1), (0, 2), (0, 3)]
    again = lru.request(0, [1])
    assert again.evictions == ((1, 1),)
    assert lru.counters.rereads == 1
    lru.check_valid()


def test_a_request_larger_than_the_budget_is_loaded_whole() -> None:
    lru = ExpertCachePolicy(budget_bytes=0, entry_bytes=[4, 4, 4, 4], n_expert=8)
    out = lru.request(2, [5, 6, 5])
    assert out.loads == ((2, 5), (2, 6))
    out = lru.request(3, [1])
    assert out.evictions == ((2, 5), (2, 6))
    assert lru.resident_bytes == 4
    lru.check_valid()


def test_shrinking_the_budget_evicts_least_recent_first() -> None:
    lru = ExpertCachePolicy(budget_bytes=100, entry_bytes=[10] * 4, n_expert=2)
    for layer in range(4):
        lru.request(layer, [0])
    assert lru.set_budget(20) == ((0, 0), (1, 0))
    assert lru.resident() == [(2, 0), (3, 0)]


def test_entries_of_a_bigger_layer_count_their_own_size() -> None:
    # a Q4_K_M-like file: layer 1's experts are stored at a higher precision
    lru = ExpertCachePolicy(budget_bytes=30, entry_bytes=[10, 25], n_expert=4)
    lru.request(0, [0, 1])
    out = lru.request(1, [0])  # 20 + 25 > 30: both small entries must go
    assert out.evictions == ((0, 0), (0, 1))
    assert (lru.resident_bytes, lru.counters.bytes_read) == (25, 45)
    out = lru.request(0, [2])  # 25 + 10 > 30: the big one goes
    assert out.evictions == ((1, 0),)
    lru.check_valid()


def test_a_routing_it_cannot_serve_is_refused_and_changes_nothing() -> None:
    lru = ExpertCachePolicy(budget_bytes=100, entry_bytes=[10, 0], n_expert=4)
    lru.request(0, [1])
    with pytest.raises(ValueError, match="layer 1 has no routed experts"):
        lru.request(1, [0])
    with pytest.raises(ValueError, match="expert id 4 out of range"):
        lru.request(0, [2, 4])
    assert lru.resident() == [(0, 1)] and lru.counters.requests == 1
    lru.check_valid()


@given(
    budget=st.integers(min_value=0, max_value=12),
    sizes=st.lists(st.integers(1, 3), min_size=4, max_size=4),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 7), min_size=1, max_size=4)), max_size=60
    ),
)
def test_with_no_room_for_a_protected_segment_it_behaves_like_a_plain_lru_model(
    budget: int, sizes: list[int], steps: list[tuple[int, list[int]]]
) -> None:
    # a token cycle of 8 experts per layer is more than any budget here: the cap is 0
    lru = ExpertCachePolicy(budget_bytes=budget, entry_bytes=sizes, n_expert=8, n_expert_used=8)
    order: list[tuple[int, int]] = []  # the model: a list, oldest first

    def used() -> int:
        return sum(sizes[layer] for layer, _ in order)

    for layer, experts in steps:
        wanted = list(dict.fromkeys((layer, e) for e in experts))
        hits = [w for w in wanted if w in order]
        misses = [w for w in wanted if w not in order]
        for h in hits:
            order.remove(h)
            order.append(h)
        evicted = []
        if misses:
            for entry in list(order):
                if used() + len(misses) * sizes[layer] <= budget:
                    break
                if entry not in wanted:
                    order.remove(entry)
                    evicted.append(entry)
        order.extend(misses)
        out = lru.request(layer, experts)
        assert (list(out.hits), list(out.loads), list(out.evictions)) == (hits, misses, evicted)
        assert lru.resident() == order
        assert lru.resident_bytes == used()
        assert lru.kept() == []
        lru.check_valid()


@given(
    budget=st.integers(min_value=0, max_value=24),
    sizes=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    k=st.integers(1, 2),
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 7), min_size=1, max_size=3)), max_size=80
    ),
)
def test_decode_behaves_like_a_plain_segmented_lru_model(
    budget: int, sizes: list[int], k: int, steps: list[tuple[int, list[int]]]
) -> None:
    slru = ExpertCachePolicy(budget_bytes=budget, entry_bytes=sizes, n_expert=8, n_expert_used=k)
    cap = max(0, budget - k * sum(sizes))
    assert slru.kept_cap() == cap
    probation: list[tuple[int, int]] = []  # the model: two lists, oldest first
    protected: list[tuple[int, int]] = []

    def size(entries: list[tuple[int, int]]) -> int:
        return sum(sizes[layer] for layer, _ in entries)

    for layer, experts in steps:
        wanted = list(dict.fromkeys((layer, e) for e in experts))
        hits = [w for w in wanted if w in probation or w in protected]
        misses = [w for w in wanted if w not in hits]
        for h in hits:  # a decode hit: to the protected segment's most recent end
            (probation if h in probation else protected).remove(h)
            protected.append(h)
            while size(protected) > cap:  # its oldest back to probation's most recent end
                probation.append(protected.pop(0))
        evicted = []
        if misses:
            for entry in probation + protected:
                if size(probation + protected) + len(misses) * sizes[layer] <= budget:
                    break
                if entry not in wanted:
                    (probation if entry in probation else protected).remove(entry)
                    evicted.append(entry)
        probation.extend(misses)
        out = slru.request(layer, experts)
        assert (list(out.hits), list(out.loads), list(out.evictions)) == (hits, misses, evicted)
        assert slru.resident() == probation + protected
        assert slru.kept() == protected
        assert (slru.resident_bytes, slru.kept_bytes) == (size(probation + protected), size(protected))
        slru.check_valid()


def test_a_prefetch_enters_cold_never_evicts_what_is_in_use_and_is_adopted_once() -> None:
    lru = ExpertCachePolicy(budget_bytes=4 * 10, entry_bytes=[10, 10], n_expert=8)
    lru.request(0, [1, 2])  # in use: (0,1), (0,2)
    lru.request(1, [1])  # in use now: (1,1); (0,1), (0,2) are not any more
    plan = lru.prefetch(0, [3, 4, 5])
    assert plan.issued == ((0, 3), (0, 4), (0, 5))
    assert plan.evictions == ((0, 1), (0, 2))  # the LRU entries, never (1,1) nor this prefetch's
    assert lru.resident()[:3] == [(0, 5), (0, 4), (0, 3)]  # at the cold end
    out = lru.request(0, [4, 6])
    assert out.adopted == ((0, 4),) and out.loads == ((0, 6),)
    assert lru.request(0, [4]).adopted == ()  # adopted once
    c = lru.counters
    assert (c.prefetch_issued, c.prefetch_hits, c.prefetch_wasted) == (3, 1, 1)  # (0,5) evicted unused
    lru.check_valid()


def test_a_prefetch_never_evicts_an_entry_of_its_own_list() -> None:
    lru = ExpertCachePolicy(budget_bytes=3 * 10, entry_bytes=[10, 10], n_expert=8)
    lru.request(0, [1, 2])
    lru.request(1, [1])  # in use now; (0,1) is the oldest
    plan = lru.prefetch(0, [1, 3])  # (0,1) is on the list: (0,2) goes instead
    assert plan.evictions == ((0, 2),) and plan.issued == ((0, 3),)
    lru.check_valid()


def test_a_committed_prefetch_touches_its_residents_and_enters_hot() -> None:
    lru = ExpertCachePolicy(budget_bytes=4 * 10, entry_bytes=[10, 10], n_expert=8)
    lru.request(0, [1, 2])
    lru.request(1, [1])
    plan = lru.prefetch(0, [1, 3], hot=True)
    assert plan.evictions == () and plan.issued == ((0, 3),)
    assert lru.resident() == [(0, 2), (1, 1), (0, 1), (0, 3)]  # most recent last
    lru.request(1, [2, 3])  # needs room: the cold (0,2) goes, never the committed ones
    assert lru.resident()[:2] == [(0, 1), (0, 3)]
    lru.check_valid()


def test_a_prefetch_with_no_room_issues_nothing_more() -> None:
    lru = ExpertCachePolicy(budget_bytes=2 * 10, entry_bytes=[10, 10], n_expert=8)
    lru.request(1, [0, 1])  # fills the budget with entries in use
    assert lru.prefetch(0, [1, 2]) == PrefetchPlan(layer=0, evictions=(), issued=())
    lru.check_valid()


def test_a_prefill_request_keeps_only_its_share_hot_so_a_prompt_does_not_flush_the_cache() -> None:
    # 2 MoE layers, a budget of 6 entries: a layer's share is 3
    lru = ExpertCachePolicy(budget_bytes=6 * 10, entry_bytes=[10, 10], n_expert=8)
    assert lru.share(0) == 3
    lru.request(0, [7], n_tokens=1)  # decode's hot entry
    # a prefill batch routes 5 experts of layer 1; 4, 5 and 6 most often (then 1 and 2)
    routed = [4, 5, 6, 4, 5, 6, 4, 5, 6, 1, 2]
    plan = lru.request(1, routed, n_tokens=6)
    assert plan.loads == ((1, 4), (1, 5), (1, 6), (1, 1), (1, 2)) and plan.evictions == ()
    # the hot three are the most recent; the two others wait at the cold end
    assert lru.resident() == [(1, 2), (1, 1), (0, 7), (1, 4), (1, 5), (1, 6)]
    plan = lru.request(0, [0, 1], n_tokens=1)  # the next loads evict the prompt's cold ones first
    assert plan.evictions == ((1, 2), (1, 1))
    assert (0, 7) in lru.resident()
    lru.check_valid()


def test_a_decode_request_or_a_small_batch_is_plain_lru() -> None:
    lru = ExpertCachePolicy(budget_bytes=6 * 10, entry_bytes=[10, 10], n_expert=8)
    lru.request(1, [3, 3, 2], n_tokens=2)  # 2 experts <= share 3: all hot
    lru.request(1, [0, 1, 4, 5], n_tokens=1)  # decode: all hot too
    assert lru.resident() == [(1, 3), (1, 2), (1, 0), (1, 1), (1, 4), (1, 5)]


# -- the segmented LRU: probation, then the protected segment --------------------------------


def test_a_decode_hit_promotes_and_one_off_misses_evict_probation_first() -> None:
    # 4 entries; k = 1 over 2 layers: a token cycle of 2 entries, so 2 may be protected
    slru = ExpertCachePolicy(budget_bytes=4 * 10, entry_bytes=[10, 10], n_expert=8, n_expert_used=1)
    assert slru.kept_cap() == 20
    slru.request(0, [1])
    assert slru.request(0, [1]).hits == ((0, 1),)  # used before: promoted
    assert slru.kept() == [(0, 1)]
    for e in (1, 2, 3):
        slru.request(1, [e])
    assert slru.resident() == [(1, 1), (1, 2), (1, 3), (0, 1)]  # probation, then protected
    out = slru.request(1, [4])  # an LRU would evict (0, 1), the least recently used
    assert out.evictions == ((1, 1),)
    assert slru.resident() == [(1, 2), (1, 3), (1, 4), (0, 1)]
    slru.check_valid()


def test_the_first_use_of_a_read_ahead_is_not_a_promotion_the_second_is() -> None:
    slru = ExpertCachePolicy(budget_bytes=4 * 10, entry_bytes=[10, 10], n_expert=8, n_expert_used=1)
    slru.request(1, [0])
    assert slru.prefetch(0, [3]).issued == ((0, 3),)
    assert slru.prefetch(0, [4], hot=True).issued == ((0, 4),)
    assert slru.resident() == [(0, 3), (1, 0), (0, 4)]
    out = slru.request(0, [3, 4])
    assert out.adopted == ((0, 3), (0, 4))
    assert slru.kept() == []  # they stand for the misses they saved
    assert slru.resident() == [(1, 0), (0, 3), (0, 4)]  # touched to probation's recent end
    slru.request(0, [4])
    assert slru.kept() == [(0, 4)]
    slru.check_valid()


def test_the_protected_segment_is_capped_at_the_budget_less_one_token_cycle() -> None:
    # 5 entries, k = 1 over 2 layers: at most 3 protected
    slru = ExpertCachePolicy(budget_bytes=5 * 10, entry_bytes=[10, 10], n_expert=8, n_expert_used=1)
    assert slru.kept_cap() == 30
    slru.request(0, [0, 1, 2, 3])
    for e in (0, 1, 2, 3):
        slru.request(0, [e])
    # the fourth promotion pushed (0, 0) back to probation's most recent end: same place
    assert slru.kept() == [(0, 1), (0, 2), (0, 3)] and slru.kept_bytes == 30
    assert slru.resident() == [(0, 0), (0, 1), (0, 2), (0, 3)]
    slru.request(1, [5])  # a miss enters probation's most recent end, after the demoted one
    assert slru.resident() == [(0, 0), (1, 5), (0, 1), (0, 2), (0, 3)]
    assert slru.request(1, [6]).evictions == ((0, 0),)
    slru.check_valid()
    assert slru.set_budget(4 * 10) == ((1, 5),)  # cap 20 now: (0, 1) is demoted, not evicted
    assert slru.kept() == [(0, 2), (0, 3)]
    assert slru.resident() == [(1, 6), (0, 1), (0, 2), (0, 3)]
    slru.check_valid()
    slru.set_budget(10)
    assert slru.kept_cap() == 0 and slru.kept() == []  # never below zero
    slru.check_valid()


def test_without_k_the_cap_takes_the_widest_decode_request_seen() -> None:
    slru = ExpertCachePolicy(budget_bytes=10 * 10, entry_bytes=[10, 0, 10], n_expert=8)
    assert slru.kept_cap() == 100  # no decode yet
    slru.request(0, [1, 2, 3, 4, 5], n_tokens=4)  # a prefill batch says nothing about k
    assert slru.kept_cap() == 100
    slru.request(2, [1, 2])
    assert slru.kept_cap() == 100 - 2 * 20
    slru.request(2, [3])  # a narrower request does not lower k
    assert slru.kept_cap() == 60
    slru.check_valid()


def test_eviction_takes_probation_then_the_oldest_protected_never_a_wanted_entry() -> None:
    # 3 entries, k = 1 over 2 layers: 1 protected
    slru = ExpertCachePolicy(budget_bytes=3 * 10, entry_bytes=[10, 10], n_expert=8, n_expert_used=1)
    slru.request(0, [0])
    slru.request(0, [0])
    slru.request(1, [1])
    slru.request(1, [2])
    assert (slru.resident(), slru.kept()) == ([(1, 1), (1, 2), (0, 0)], [(0, 0)])
    out = slru.request(1, [1, 2, 3], n_tokens=2)  # probation holds only what it wants
    assert out.evictions == ((0, 0),)
    assert slru.kept() == []  # a prefill's hits are not promoted
    slru.check_valid()


def test_a_prefill_loads_into_probation_keeping_its_share_hot_and_promotes_nothing() -> None:
    # 6 entries over 2 MoE layers: a share of 3; k = 1: up to 4 protected
    slru = ExpertCachePolicy(budget_bytes=6 * 10, entry_bytes=[10, 10], n_expert=8, n_expert_used=1)
    slru.request(0, [7])
    slru.request(0, [7])  # decode's protected entry
    routed = [4, 5, 6, 4, 5, 6, 4, 5, 6, 1, 2]
    plan = slru.request(1, routed, n_tokens=6)
    assert plan.loads == ((1, 4), (1, 5), (1, 6), (1, 1), (1, 2)) and plan.evictions == ()
    # the hot three at probation's most recent end, the two others at the cold end
    assert slru.resident() == [(1, 2), (1, 1), (1, 4), (1, 5), (1, 6), (0, 7)]
    slru.request(1, [4, 5], n_tokens=2)  # prefill hits: touched in probation
    slru.request(0, [7], n_tokens=2)  # a protected entry a prompt routes stays protected
    assert slru.kept() == [(0, 7)]
    assert slru.resident() == [(1, 2), (1, 1), (1, 6), (1, 4), (1, 5), (0, 7)]
    assert slru.request(0, [2, 3]).evictions == ((1, 2), (1, 1))  # the prompt's cold ones first
    slru.check_valid()


def test_a_profiles_warm_up_is_not_a_prefetch_and_its_later_hits_are_plain_hits() -> None:
    """The ``moe-prefetch: 2 read ahead, 32 used (1600.0%)`` line: a warm-up's reads were
    counted as prefetches issued before the measured window and adopted in it. Warm reads
    are ``warm_issued``; a request that routes to one is a hit, not a prefetch's use, and
    is promoted by a decode hit as an entry used before. But its read may still be in
    flight (issue 43: computing on a warmed entry whose bytes had not landed printed text
    the model never produced): the first request that routes to it adopts it, so the
    engine waits for that read; the next one does not."""
    policy = ExpertCachePolicy(budget_bytes=10 * 8, entry_bytes=[10, 10], n_expert=8)
    warm = policy.prefetch(0, [1, 2, 3], hot=True, warm=True)
    assert warm.issued == ((0, 1), (0, 2), (0, 3))
    assert not policy.holds_layer(0)
    early = policy.prefetch(1, [4], hot=False)
    plan = policy.request(0, [1, 2], n_tokens=1)
    assert plan.hits == ((0, 1), (0, 2)) and plan.adopted == ((0, 1), (0, 2))
    assert policy.kept() == [(0, 1), (0, 2)]  # promoted: a plain decode hit
    assert policy.request(0, [1, 3], n_tokens=1).adopted == ((0, 3),)
    policy.request(1, [4], n_tokens=1)
    c = policy.counters
    assert (c.warm_issued, c.prefetch_issued, c.prefetch_hits, c.hits) == (3, 1, 1, 5)
    assert early.issued == ((1, 4),)
    policy.check_valid()


def test_a_decode_step_of_several_sequences_counts_as_decode_not_as_a_scan() -> None:
    """Two sequences' tokens in one call: their experts' hits promote (as one token's do),
    where the same call read as a prefill of two tokens leaves them in probation."""

    def after_second_use(decode: bool | None) -> list[tuple[int, int]]:
        policy = ExpertCachePolicy(budget_bytes=10 * 40, entry_bytes=[10], n_expert=16, n_expert_used=2)
        policy.request(0, [1, 2, 3, 4], n_tokens=2, decode=decode)
        policy.request(0, [1, 2, 3, 4], n_tokens=2, decode=decode)
        policy.check_valid()
        return sorted(policy.kept())

    assert after_second_use(True) == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert after_second_use(None) == []


def test_a_layer_held_whole_passes_its_calls_and_nothing_else_changes() -> None:
    policy = ExpertCachePolicy(budget_bytes=10 * 8, entry_bytes=[10, 10], n_expert=4)
    assert not policy.holds_layer(0) and not policy.pass_layer(0)
    policy.request(0, [0, 1, 2, 3], n_tokens=4)
    assert policy.holds_layer(0) and not policy.holds_layer(1)
    before = (policy.resident(), attrs.evolve(policy.counters))
    assert policy.pass_layer(0)
    assert policy.resident() == before[0]
    assert policy.counters == attrs.evolve(before[1], passed=1)
    # an expert read ahead and not used yet may still be reading: the layer is not held
    policy.request(1, [0, 1, 2], n_tokens=3)
    policy.prefetch(1, [3])
    assert not policy.holds_layer(1) and not policy.pass_layer(1)
    policy.request(1, [3])  # adopted: its read is waited for
    assert policy.pass_layer(1) and policy.counters.passed == 2
    policy.set_budget(10 * 7)  # one goes: neither layer may be held now
    assert not (policy.holds_layer(0) and policy.holds_layer(1))


def test_a_layer_without_experts_is_never_held() -> None:
    policy = ExpertCachePolicy(budget_bytes=100, entry_bytes=[10, 0], n_expert=2)
    assert not policy.holds_layer(1) and not policy.holds_layer(7) and not policy.pass_layer(-1)


def test_layers_are_passed_only_where_no_one_wants_every_call() -> None:
    from bmoe.domain.streaming import StreamConfig

    assert not StreamConfig(enabled=True).layers_passed  # off by default
    assert StreamConfig(enabled=True, pass_layers=True).layers_passed
    assert not StreamConfig(enabled=True, pass_layers=True, route_ahead=2).layers_passed
    assert not StreamConfig(enabled=True, pass_layers=True, route_trace="rt.csv").layers_passed
    assert not StreamConfig(enabled=True, pass_layers=True, io_trace="io.csv").layers_passed
