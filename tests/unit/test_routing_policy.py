"""The routing decisions of reading ahead, dropping and substituting (pinned examples)."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming import routing


def test_rank_is_best_first_and_ties_go_to_the_lower_id() -> None:
    assert routing.rank([0.1, 0.5, 0.5, 0.9], 3) == [3, 1, 2]
    assert routing.rank([1.0, 2.0], 0) == []
    with pytest.raises(ValueError):
        routing.rank([1.0], -1)


def test_slot_agreement_counts_distinct_named_ids() -> None:
    assert routing.slot_agreement([1, 2, 3], [3, 4, 1, 1]) == 2


def test_routing_weights_normalise_probabilities_or_softmax_logits() -> None:
    assert routing.routing_weights([0.2, 0.6], from_logits=False) == pytest.approx([0.25, 0.75])
    assert routing.routing_weights([0.0, 0.0], from_logits=False) == [0.5, 0.5]
    w = routing.routing_weights([0.0, 0.0, 0.0, 0.0], from_logits=True)
    assert w == pytest.approx([0.25] * 4)


def test_drop_cold_drops_only_cold_misses_and_never_the_top_expert() -> None:
    weights = [0.05, 0.6, 0.05, 0.3]
    # threshold 0.75 / 4 = 0.1875: slots 0 and 2 are cold; slot 2 is resident
    assert routing.drop_cold(weights, [False, False, True, False], 0.75) == [True, False, False, False]
    # the top expert is kept even when everything is below the threshold
    assert routing.drop_cold([0.25] * 4, [False] * 4, 4.0) == [False, True, True, True]
    assert routing.drop_cold(weights, [False] * 4, 0.0) == [False] * 4


def test_substitute_takes_the_best_resident_within_the_margin_never_for_the_top() -> None:
    scores = [0.5, 0.3, 0.25, 0.2, 0.05]
    resident = [False, False, True, True, True]
    # slot 0 (expert 0) is the top: kept although cold; expert 1 (0.3) -> best resident
    # within 0.1 and not selected: 2 (0.25)
    assert routing.substitute([0, 1], scores, resident, 0.1) == [0, 2]
    # nothing within 0.01: kept
    assert routing.substitute([0, 1], scores, resident, 0.01) == [0, 1]
    # a substitute is not taken twice: the second cold slot gets the next best
    assert routing.substitute([0, 1, 4], scores, [False, False, True, True, False], 0.3) == [0, 2, 3]


def test_drop_aware_reads_ahead_skip_the_cold_tail() -> None:
    assert routing.weight_threshold_ids([7, 3, 5], [0.7, 0.25, 0.05], 0.75) == [7, 3]
    assert routing.weight_threshold_ids([7, 3, 5], [0.7, 0.25, 0.05], 0.0) == [7, 3, 5]
