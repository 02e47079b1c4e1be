"""The expert cache policy against a plain model, with its invariants checked."""

from __future__ import annotations

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
def test_behaves_like_a_plain_lru_model(
    budget: int, sizes: list[int], steps: list[tuple[int, list[int]]]
) -> None:
    lru = ExpertCachePolicy(budget_bytes=budget, entry_bytes=sizes, n_expert=8)
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
        lru.check_valid()


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
