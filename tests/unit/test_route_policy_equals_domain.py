"""The C routing decisions (``cext/route_policy.pxd``, what the engine runs) equal the
domain's (``bmoe.domain.streaming.routing``) on the same random inputs, ties included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.cext import route_policy as c_policy
from bmoe.domain.streaming import routing
from bmoe.domain.streaming.decode_routing import AUTO_COLD_PCT, auto_gate_open

N_EXPERT = 16

# float32 scores with many ties (a few distinct values), as the router's outputs are held
scores_st = st.lists(
    st.sampled_from([-2.5, -1.0, 0.0, 0.125, 0.3, 0.3000000119, 1.0, 7.75]),
    min_size=N_EXPERT,
    max_size=N_EXPERT,
).map(lambda xs: [float(np.float32(x)) for x in xs])
flags_st = st.lists(st.booleans(), min_size=N_EXPERT, max_size=N_EXPERT)


@settings(max_examples=400, deadline=None)
@given(scores=scores_st, k=st.integers(0, N_EXPERT))
def test_rank(scores: list[float], k: int) -> None:
    assert c_policy.rank(scores, k) == routing.rank(scores, k)


@settings(max_examples=300, deadline=None)
@given(
    predicted=st.lists(st.integers(0, N_EXPERT - 1), max_size=8),
    actual=st.lists(st.integers(0, N_EXPERT - 1), max_size=8),
)
def test_slot_agreement(predicted: list[int], actual: list[int]) -> None:
    assert c_policy.slot_agreement(predicted, actual) == routing.slot_agreement(predicted, actual)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(-30, 30, width=32), min_size=1, max_size=8),
    from_logits=st.booleans(),
    fraction=st.sampled_from([0.0, 0.25, 0.75, 1.0]),
    resident=flags_st,
)
def test_weights_and_drop(
    values: list[float], from_logits: bool, fraction: float, resident: list[bool]
) -> None:
    weights = routing.routing_weights(values, from_logits=from_logits)
    assert c_policy.routing_weights(values, from_logits=from_logits) == weights
    k = len(values)
    assert c_policy.drop_cold(weights, resident[:k], fraction) == routing.drop_cold(
        weights, resident[:k], fraction
    )
    ranked = list(range(k))
    assert c_policy.weight_threshold_ids(ranked, weights, fraction) == routing.weight_threshold_ids(
        ranked, weights, fraction
    )


@settings(max_examples=400, deadline=None)
@given(
    scores=scores_st,
    resident=flags_st,
    k=st.integers(1, 8),
    margin=st.sampled_from([0.0, 0.1, 0.5, 10.0]),
)
def test_substitute(scores: list[float], resident: list[bool], k: int, margin: float) -> None:
    ids = routing.rank(scores, k)
    assert c_policy.substitute(ids, scores, resident, margin) == routing.substitute(
        ids, scores, resident, margin
    )


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_the_auto_gate(cold: int, slots: int) -> None:
    assert c_policy.gate_open(cold, slots, AUTO_COLD_PCT) == auto_gate_open(cold, slots)
