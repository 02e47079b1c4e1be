"""The expert cache's expected hit rate for a budget: a floor from uniform routing, and the
curve a usage profile gives.

Uniform routing (every expert of a layer equally likely, independently): a cache that
holds ``c`` of a layer's ``n`` experts hits about ``c / n`` of the time, whatever it evicts,
below ``k`` (the experts one token routes to in a layer) too. What cycles below ``k`` is an
LRU on routing that *repeats* (each token evicts what the next one needs: no hits); the
adaptive rule's frequency half keeps what repeats (measured, the 48-layer bench model with
7.7 of a layer's 8 in a 2 GiB group: 50.4% hits). A real model routes unevenly, so this is
a floor.

A usage profile (``--profile``, the routing counts earlier runs of this model learned)
gives a better guess: a cache that holds a layer's ``c`` most-used experts hits the share
of the layer's routing they took. An LRU does a little worse than that static choice on
fresh routing and better on a conversation that repeats itself; the plan shows the figure
as the profile's, beside the floor.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bmoe.domain.streaming.usage_profile import UsageProfile


def entries_per_layer(budget_bytes: int, expert_bytes: int, n_expert: int) -> float:
    """How many of a layer's experts a budget holds (each layer alike)."""
    if expert_bytes <= 0:
        return 0.0
    return budget_bytes * n_expert / expert_bytes


def uniform_hit_rate(budget_bytes: int, expert_bytes: int, n_expert: int) -> float:
    """The hit rate under uniform routing (module docstring): the share of each layer's
    experts the budget holds, at most all of them."""
    return min(1.0, entries_per_layer(budget_bytes, expert_bytes, n_expert) / max(1, n_expert))


@attrs.frozen
class CurvePoint:
    budget_bytes: int
    hit_rate: float


def profile_hit_rate(profile: UsageProfile, held_per_layer: float, moe_layers: Sequence[int]) -> float:
    """The share of the profile's routing a cache holding each MoE layer's ``held_per_layer``
    most-used experts would serve (a layer the profile never saw counts as uniform)."""
    if not moe_layers:
        return 0.0
    c = max(0, min(profile.n_expert, int(held_per_layer)))
    total = 0.0
    for layer in moe_layers:
        row = sorted((profile.count(layer, e) for e in range(profile.n_expert)), reverse=True)
        s = sum(row)
        total += sum(row[:c]) / s if s > 0 else c / profile.n_expert
    return total / len(moe_layers)


def profile_curve(
    profile: UsageProfile, expert_bytes: int, moe_layers: Sequence[int], shares: Sequence[float]
) -> list[CurvePoint]:
    """The profile's hit rate at budgets holding ``shares`` of every expert."""
    n = profile.n_expert
    return [CurvePoint(int(expert_bytes * s), profile_hit_rate(profile, s * n, moe_layers)) for s in shares]
