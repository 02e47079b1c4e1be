"""Every guess the plan has of a cache's hit rate, each named, and which one it expects.

- the uniform floor (``hit_rate.uniform_hit_rate``): always;
- the published curve of the model's family (``published_routing``), at the cache's share of
  the experts: where the family has one;
- this model's usage profile (``hit_rate.profile_hit_rate``): where earlier runs here left one;
- what ``bmoe.plan --verify`` measured here (``verified``), carried to this cache's share.

The expected one is the best informed: measured here, else the profile, else the floor (a
published curve is another model's routing: it bounds the range, it is not expected).
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.domain.plan.decode_range import HitGuess
from bmoe.domain.plan.figures import ModelFigures
from bmoe.domain.plan.hit_rate import entries_per_layer, profile_hit_rate, uniform_hit_rate
from bmoe.domain.plan.published_routing import family_curve
from bmoe.domain.plan.verified import VerifiedRun, hit_rate_at, nearest
from bmoe.domain.streaming.usage_profile import UsageProfile

FLOOR = "uniform routing, a floor"
PROFILE = "this model's usage profile"
MEASURED = "measured here (bmoe.plan --verify)"


def hit_guesses(
    model: ModelFigures,
    budget_bytes: int,
    profile: UsageProfile | None = None,
    verified: Sequence[VerifiedRun] = (),
) -> tuple[tuple[HitGuess, ...], HitGuess]:
    """The guesses at ``budget_bytes`` and the expected one (module docstring)."""
    share = model.cache_share(budget_bytes)
    floor = HitGuess(FLOOR, uniform_hit_rate(budget_bytes, model.expert_bytes, model.n_expert))
    guesses = [floor]
    expected = floor
    curve = family_curve(model.arch)
    if curve is not None:
        guesses.append(HitGuess(curve.name, curve.hit_rate(share)))

    def by_profile(at: float) -> float:
        assert profile is not None
        held = entries_per_layer(int(at * model.expert_bytes), model.expert_bytes, model.n_expert)
        return 0.0 if held < model.n_expert_used else profile_hit_rate(profile, held, model.moe_layers)

    if profile is not None:
        expected = HitGuess(PROFILE, by_profile(share))
        guesses.append(expected)
    run = nearest(verified, share)
    if run is not None:
        expected = HitGuess(MEASURED, hit_rate_at(run, share, by_profile if profile is not None else None))
        guesses.append(expected)
    return tuple(guesses), expected
