"""The decode routing policies in Python (``DecodeRouting``), alone and executed by
``PolicyStreaming`` on the fake expert source with a scripted router view: what is
committed, graded, substituted, dropped, checked and read ahead."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming import ExpertCachePolicy
from bmoe.domain.streaming.decode_routing import (
    AUTO_WINDOW,
    SOFTMAX,
    SOFTMAX_WEIGHT,
    DecodeRouting,
    Routers,
    RouterScores,
    RoutingSettings,
    Scorer,
    auto_gate_open,
)
from bmoe.service.expert_streaming import PolicyStreaming
from bmoe.testing.fake_expert_source import FakeExpertSource
from bmoe.testing.fake_router_view import FakeRouterView

SIZES = [64, 0, 64, 64, 64]  # layer 1 has no routed experts
N_EXPERT = 8
MOE = frozenset({0, 2, 3, 4})
# each layer's router ranks two experts first: layer 2 -> 5, 6; layer 3 -> 1, 2; layer 4 -> 7, 0
ROUTERS = {
    0: [0.9, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
    2: [0.1, 0.1, 0.1, 0.1, 0.1, 0.9, 0.8, 0.1],
    3: [0.1, 0.9, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1],
    4: [0.8, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9],
}


def scorer(routers: dict[int, list[float]] = ROUTERS) -> Scorer:
    return lambda layer: RouterScores(tuple(routers[layer]), tuple(routers[layer]))


def routing(budget: int = 10_000, gating: int = SOFTMAX, **settings: object) -> DecodeRouting:
    cache = ExpertCachePolicy(budget, SIZES, N_EXPERT)
    return DecodeRouting(RoutingSettings(**settings), Routers(2, gating, MOE), cache)  # type: ignore[arg-type]


def token(r: DecodeRouting, selections: dict[int, list[int]], probs: list[float] | None = None) -> list:
    """One decode token through every MoE layer (route, request, reads ahead): the routes."""
    routes = []
    for layer in sorted(selections):
        route = r.route(layer, selections[layer], probs, scorer())
        r.cache.request(layer, route.served)
        r.reads_ahead(layer)
        routes.append(route)
    return routes


def test_route_ahead_commits_the_ranking_made_n_moe_layers_earlier_in_the_token() -> None:
    r = routing(route_ahead=1)
    # each selection shares one expert with its own router's top-2 (the watchdog tolerates it)
    routes = token(r, {0: [0, 1], 2: [5, 3], 3: [1, 3], 4: [7, 3]})
    assert [route.ids for route in routes] == [(0, 1), (5, 6), (1, 2), (7, 0)]
    assert [route.rewritten for route in routes] == [False, True, True, True]
    c = r.counters
    assert (c.route_ahead_committed, c.route_ahead_passed) == (3, 1)
    assert (c.route_ahead_slots, c.route_ahead_agree) == (6, 3)
    assert c.decode_slots == 8 and c.watchdog_checks == 4 and c.watchdog_trips == 0


def test_route_ahead_2_skips_layers_without_experts_and_reads_the_commitment_ahead_hot() -> None:
    r = routing(route_ahead=2)
    r.route(0, [0, 1], None, scorer())
    r.cache.request(0, [0, 1])
    (plan,) = r.reads_ahead(0)  # two MoE layers on from 0 is 3 (1 has no experts)
    assert plan.layer == 3 and plan.issued == ((3, 1), (3, 2))
    assert r.cache.resident()[-2:] == [(3, 1), (3, 2)]  # hot: the most recent end, not the cold end


def test_a_ranking_is_used_only_within_its_token() -> None:
    r = routing(route_ahead=1)
    r.route(0, [0, 1], None, scorer())
    r.reads_ahead(0)  # ranks layer 2 for this token
    r.route(0, [0, 1], None, scorer())  # a new token starts: layer 0 again
    assert r.route(2, [3, 4], None, scorer()).ids == (3, 4)
    assert r.counters.route_ahead_passed == 3 and r.counters.route_ahead_committed == 0


def test_the_prediction_is_graded_against_the_graphs_selection_per_layer() -> None:
    r = routing(predict_log=True)
    token(r, {0: [0, 1], 2: [5, 0], 3: [1, 2], 4: [7, 3]})
    c = r.counters
    assert c.predict_slots == {2: 2, 3: 2, 4: 2}
    assert c.predict_agree == {2: 1, 3: 2, 4: 1}
    assert r.predict_layers(5) == ((0, 0), (0, 0), (2, 1), (2, 2), (2, 1))
    assert r.cache.counters.prefetch_issued == 0  # the log only observes


def test_predictive_prefetch_reads_at_most_spec_max_misses_cold() -> None:
    r = routing(predict_prefetch=True, spec_max=1)
    r.route(0, [0, 1], None, scorer())
    r.cache.request(0, [0, 1])
    (plan,) = r.reads_ahead(0)
    assert plan.issued == ((2, 5),)  # the best-ranked miss only
    assert r.cache.resident()[0] == (2, 5)  # a guess enters at the cold end


def test_a_deeper_prediction_guesses_the_next_moe_layers_nearest_first_and_guesses_again() -> None:
    r = routing(predict_prefetch=True, spec_max=1, predict_depth=2)
    r.route(0, [0, 1], None, scorer())
    r.cache.request(0, [0, 1])
    near, far = r.reads_ahead(0)  # layers 2 and 3 (1 has no experts), a miss each
    assert (near.issued, far.issued) == (((2, 5),), ((3, 1),))
    r.route(2, [5, 6], None, scorer())
    r.cache.request(2, [5, 6])
    near, far = r.reads_ahead(2)  # layer 3 again: its first guess is resident, one more miss
    assert (near.issued, far.issued) == (((3, 2),), ((4, 7),))
    assert r.counters.predict_slots == {2: 2}


def test_the_prediction_depth_is_checked() -> None:
    for depth in (0, 5):
        with pytest.raises(ValueError, match="depth"):
            routing(predict_prefetch=True, predict_depth=depth)


def test_the_watchdog_disarms_prediction_and_route_ahead_when_the_router_disagrees() -> None:
    r = routing(route_ahead=1)
    route = r.route(0, [4, 5], None, scorer())  # layer 0's own router names 0 and 1
    assert r.disarmed and r.trip == (1, 0, 0)
    assert r.counters.watchdog_trips == 1 and r.reads_ahead(0) == []
    assert route.ids == (4, 5)
    for _ in range(20):  # no more checks, everything passes through
        token(r, {0: [0, 1], 2: [5, 6]})
    assert r.counters.watchdog_checks == 1 and r.counters.route_ahead_committed == 0


def test_the_watchdog_checks_the_first_token_and_every_16th() -> None:
    r = routing(predict_log=True)
    for _ in range(33):
        token(r, {0: [0, 1]})
    assert r.counters.watchdog_checks == 3  # tokens 1, 17 and 33


def test_without_the_router_input_nothing_is_ranked_checked_or_read_ahead() -> None:
    r = routing(route_ahead=1, predict_log=False)
    r.route(0, [0, 1], None, None)
    assert r.reads_ahead(0) == []
    assert r.route(2, [3, 4], None, None).ids == (3, 4)
    assert r.counters.watchdog_checks == 0 and r.counters.route_ahead_passed == 2


def test_a_top_k_the_rankings_were_not_made_for_ranks_nothing() -> None:
    r = routing(route_ahead=1)
    r.route(0, [0, 1, 2], None, scorer())
    assert r.reads_ahead(0) == [] and r.counters.watchdog_checks == 0
    assert r.counters.decode_slots == 3


def test_dropping_zeroes_cold_low_weight_slots_never_the_top_one() -> None:
    r = routing(drop_cold=1.0)
    probs = [0.7, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    route = r.route(0, [0, 1], probs, None)
    assert route.dropped == (False, True) and route.served == [0]
    r.cache.request(0, route.served)
    r.cache.request(0, [1])
    assert r.route(0, [0, 1], probs, None).dropped == (False, False)  # resident now: kept
    assert r.counters.dropped == 1 and r.counters.decode_slots == 4


def test_dropping_takes_gpt_oss_weights_as_a_softmax_of_the_logits() -> None:
    values = [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # the threshold is 0.35
    as_logits = routing(drop_cold=0.7, gating=SOFTMAX_WEIGHT).route(0, [0, 1], values, None)
    assert as_logits.dropped == (False, False)  # softmax: 0.62 and 0.38
    assert routing(drop_cold=0.7).route(0, [0, 1], values, None).dropped == (False, True)  # 0.67, 0.33


def test_substitution_serves_a_miss_from_a_resident_expert_within_the_margin() -> None:
    r = routing(substitute=0.2)
    r.cache.request(0, [3])
    probs = [0.5, 0.3, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0]
    route = r.route(0, [0, 1], probs, None)
    assert route.ids == (0, 3) and route.rewritten and r.counters.substituted == 1
    assert routing(substitute=0.05).route(0, [0, 1], probs, None).ids == (0, 1)


def test_without_probabilities_nothing_is_substituted_or_dropped() -> None:
    r = routing(substitute=1.0, drop_cold=1.0)
    r.cache.request(0, [3])
    route = r.route(0, [0, 1], None, None)
    assert route.ids == (0, 1) and not any(route.dropped) and not route.rewritten


def test_settings_that_are_all_off_are_inactive_and_bad_ones_refused() -> None:
    assert not RoutingSettings().active and RoutingSettings(substitute=0.0).active
    with pytest.raises(ValueError):
        routing(spec_max=0)
    with pytest.raises(ValueError):
        DecodeRouting(RoutingSettings(), Routers(9, SOFTMAX, MOE), ExpertCachePolicy(0, SIZES, N_EXPERT))


# -- executed through the expert-source port ------------------------------------------------


def streaming(budget: int = 10_000, **settings: object) -> tuple[PolicyStreaming, FakeExpertSource]:
    source = FakeExpertSource(SIZES, N_EXPERT, latency=0.010, lanes=2)
    s = PolicyStreaming(
        source,
        budget,
        routing=RoutingSettings(**settings),  # type: ignore[arg-type]
        routers=Routers(2, SOFTMAX, MOE),
    )
    return s, source


def test_committed_reads_are_issued_early_written_back_and_adopted_not_read_twice() -> None:
    s, src = streaming(route_ahead=1)
    view = FakeRouterView(ROUTERS)
    s.route(0, [0, 1], 1, view)
    assert src.in_flight() == [(2, 5), (2, 6)]
    plan = s.route(2, [5, 3], 1, view)
    assert view.written == [[5, 6]]
    assert plan.adopted == ((2, 5), (2, 6)) and plan.loads == ()
    assert src.reads.count((2, 5)) == 1 and src.read_back((2, 3)) == bytes(64)
    c = s.counters()
    assert (c.route_ahead_committed, c.route_ahead_passed, c.prefetch_hits) == (1, 1, 2)
    assert c.predict_layers == ((0, 0),) * 5 and c.decode_slots == 4


def test_dropped_slots_are_zeroed_by_the_view_and_never_read() -> None:
    s, src = streaming(drop_cold=1.0)
    view = FakeRouterView(ROUTERS)
    view.row = [0.7, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    plan = s.route(0, [0, 1], 1, view)
    assert view.dropped == [[False, True]] and plan.loads == ((0, 0),)
    assert (0, 1) not in src.reads and s.counters().dropped == 1


def test_prefill_calls_and_calls_without_a_view_skip_the_routing_policies() -> None:
    s, _ = streaming(route_ahead=1, drop_cold=1.0)
    view = FakeRouterView(ROUTERS)
    view.row = [0.7, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    s.route(0, [0, 1, 0, 1], 2, view)
    s.route(0, [0, 1], 1, None)
    assert view.evaluated == [] and view.dropped == [] and s.counters().decode_slots == 0


def test_the_routing_policies_need_the_routers() -> None:
    with pytest.raises(ValueError, match="routers"):
        PolicyStreaming(FakeExpertSource(SIZES, N_EXPERT), 1000, routing=RoutingSettings(route_ahead=1))


def test_the_auto_gate_opens_only_while_few_slots_are_cold() -> None:
    assert not auto_gate_open(0, 0)  # nothing observed: closed
    assert auto_gate_open(10, 100) and not auto_gate_open(11, 100)
    r = routing(predict_prefetch=True, predict_auto=True)
    assert not r.gate_open
    r.observe(cold=2, slots=2)  # a cold start: closed
    assert not r.gate_open and r.counters.predict_gate_closed == 1
    for _ in range(AUTO_WINDOW):
        r.observe(cold=0, slots=10)  # the cold call leaves the window: open
    assert r.gate_open and r.counters.predict_gate_open == AUTO_WINDOW - 1
    r.observe(cold=AUTO_WINDOW * 10, slots=0)  # one call of many cold slots closes it again
    assert not r.gate_open


def test_with_the_auto_gate_closed_the_next_layer_is_neither_ranked_nor_read() -> None:
    r = routing(predict_prefetch=True, predict_auto=True)
    ranked: list[int] = []

    def counting(layer: int) -> RouterScores:
        ranked.append(layer)
        return scorer()(layer)

    r.route(0, [0, 1], None, counting)
    r.observe(cold=2, slots=2)
    assert r.reads_ahead(0) == [] and ranked == [0]  # the watchdog's check of layer 0 only
    for _ in range(AUTO_WINDOW):
        r.observe(cold=0, slots=2)
    r.route(2, [5, 6], None, counting)
    r.cache.request(2, [5, 6])
    (plan,) = r.reads_ahead(2)
    assert ranked == [0, 2, 3] and plan.issued == ((3, 1), (3, 2))  # the watchdog checks token 1


def test_without_auto_the_gate_is_always_open() -> None:
    r = routing(predict_prefetch=True)
    r.observe(cold=100, slots=100)
    assert r.gate_open and r.counters.predict_gate_closed == 0


def test_policy_streaming_observes_each_routed_decode_call_cold_slots() -> None:
    source = FakeExpertSource(SIZES, N_EXPERT, latency=0.0)
    routers = Routers(2, SOFTMAX, MOE)
    settings = RoutingSettings(predict_prefetch=True, predict_auto=True)
    streaming = PolicyStreaming(source, 10_000, routing=settings, routers=routers)
    view = FakeRouterView(ROUTERS)
    streaming.route(0, [0, 1], 1, view)
    assert streaming.routing is not None
    assert streaming.routing.counters.predict_gate_closed == 1  # two misses of two slots
    streaming.route(0, [0, 1], 1, view)
    assert streaming.routing.counters.predict_gate_closed == 2  # 2 cold of 4: still closed
