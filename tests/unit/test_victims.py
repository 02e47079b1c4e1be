"""Whose entries a miss evicts (``bmoe.domain.streaming.victims``): the layer's own first
where its share of the budget holds two tokens' top-k, never an entry in use."""

from __future__ import annotations

from bmoe.domain.streaming.use_counts import UseCounts
from bmoe.domain.streaming.victims import LAYER_VICTIM_CYCLES, layer_first, layer_victim


def test_the_layer_goes_first_only_where_its_share_holds_two_tokens_and_k_is_known() -> None:
    assert layer_first("layer", 8, LAYER_VICTIM_CYCLES * 8)
    assert not layer_first("layer", 8, LAYER_VICTIM_CYCLES * 8 - 1)
    assert not layer_first("layer", 0, 1000)  # k not known yet: no decode request seen
    assert not layer_first("global", 8, 1000)


def test_the_layer_s_victim_follows_the_eviction_order_or_the_fewest_uses() -> None:
    resident = [(0, 1), (1, 4), (1, 2), (1, 3)]  # the eviction order
    assert layer_victim(resident, 1, frozenset(), None) == (1, 4)
    assert layer_victim(resident, 1, frozenset({(1, 4)}), None) == (1, 2)
    assert layer_victim(resident, 2, frozenset(), None) is None
    assert layer_victim(resident, 0, frozenset({(0, 1)}), None) is None
    uses = UseCounts(64, 2)
    uses.add([(1, 4), (1, 4), (1, 2)])
    assert layer_victim(resident, 1, frozenset(), uses) == (1, 3)  # no use at all
    uses.add([(1, 3), (1, 3)])
    assert layer_victim(resident, 1, frozenset(), uses) == (1, 2)
