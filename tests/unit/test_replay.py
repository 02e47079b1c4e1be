"""The routing regimes replayed through the cache (``bmoe.bench.replay``): the published
Qwen3-MoE curve is reproduced, and on every regime at 5, 10, 25 and 50% of the experts the
adaptive cache hits at least as the best fixed rule less 1 point (less 2 on traces shorter
than 1,000 tokens). Deterministic: seeded traces, no timing."""

from __future__ import annotations

import functools

import pytest

from bmoe.bench import routing_regimes
from bmoe.bench.replay import BENCH16, SHARES, Regime, core_hits, hit_pct, reference_hits, regimes


@functools.cache
def all_regimes() -> dict[str, Regime]:
    return {regime.name: regime for regime in regimes()}


def test_the_published_curve_trace_reproduces_the_qwen3_lru_curve_within_2_points() -> None:
    experts = all_regimes()["published-lru"].experts
    shares = [share for share, _ in routing_regimes.PUBLISHED_QWEN3]
    curve = routing_regimes.per_layer_lru_curve(experts, shares, 128)
    for (share, published), replayed in zip(routing_regimes.PUBLISHED_QWEN3, curve, strict=True):
        assert abs(replayed - published) <= 2.0, (share, published, replayed)


def test_the_bench_models_recorded_routing_is_kept_and_replayed() -> None:
    assert BENCH16.exists()
    regime = all_regimes()["bench16_routing"]
    assert regime.experts.shape == (1000, 16, 8) and regime.n_expert == 128


@pytest.mark.parametrize("name", ["published-lru", "zipf", "zipf-then-lru", "bench16_routing"])
@pytest.mark.parametrize("share", SHARES)
def test_adaptive_hits_within_a_point_of_the_best_fixed_rule(name: str, share: float) -> None:
    regime = all_regimes()[name]
    fixed = {rule: hit_pct(regime, share, rule) for rule in ("lru", "slru", "lfu")}
    adaptive = hit_pct(regime, share, "adaptive")
    allowed = 1.0 if regime.n_tokens >= 1000 else 2.0
    assert adaptive >= max(fixed.values()) - allowed, (fixed, adaptive)


def test_each_fixed_rule_wins_a_regime_so_no_fixed_default_is_right_everywhere() -> None:
    """The regimes disagree (else the test above would prove little): recency favours LRU,
    frequency LFU; where the routing shifts adaptive beats every fixed rule."""
    at = {
        name: {rule: hit_pct(all_regimes()[name], 0.10, rule) for rule in ("lru", "lfu", "adaptive")}
        for name in ("published-lru", "zipf", "zipf-then-lru")
    }
    assert at["published-lru"]["lru"] > at["published-lru"]["lfu"] + 10
    assert at["zipf"]["lfu"] > at["zipf"]["lru"] + 10
    assert at["zipf-then-lru"]["adaptive"] > max(at["zipf-then-lru"]["lru"], at["zipf-then-lru"]["lfu"]) + 3


@pytest.mark.parametrize("rule", ["lru", "slru", "lfu", "adaptive"])
def test_the_c_core_replays_as_the_reference_policy(rule: str) -> None:
    """The table's figures come from the C core; the Python policy gives the same hits."""
    for regime in all_regimes().values():
        small = Regime(regime.name, regime.experts[:60, :8], regime.n_expert)
        for share in (0.05, 0.25):
            budget = round(share * 8 * regime.n_expert)
            assert core_hits(small, budget, rule) == reference_hits(small, budget, rule)  # type: ignore[arg-type]
