"""The rule chooser (``rule_chooser``) and the ghost caches (``ghost_caches``) under
``--cache-policy adaptive``: the window, the margin, the hysteresis; the ghost of the rule in
charge holds what the live cache holds when nothing else differs; the live cache follows
the rule whose ghost leads."""

from __future__ import annotations

import random

import pytest

from bmoe.cext.cache_core import ExpertCacheCore
from bmoe.domain.streaming import ExpertCachePolicy
from bmoe.domain.streaming.ghost_caches import RULES
from bmoe.domain.streaming.rule_chooser import RuleChooser


def window(chooser: RuleChooser, lru: int, slru: int, lfu: int, wanted: int = 100) -> bool:
    """One full window whose decode requests hit as given (in total); whether it switched."""
    switched = False
    for i in range(chooser.window_requests):
        last = i == chooser.window_requests - 1
        hits = {"lru": lru, "slru": slru, "lfu": lfu} if last else dict.fromkeys(RULES, 0)
        switched = chooser.observe(wanted if last else 0, hits)
        assert not switched or last  # only a window's end decides
    return switched


def test_a_rule_takes_charge_only_leading_by_more_than_the_margin_over_a_window() -> None:
    chooser = RuleChooser(n_moe=4, window_tokens=2, margin_permille=10)  # 8 requests a window
    assert chooser.rule == "lfu" and chooser.window_requests == 8
    assert not window(chooser, lru=51, slru=0, lfu=50)  # 1 point of 100: not more than the margin
    assert not window(chooser, lru=50, slru=50, lfu=50)  # ties keep the rule in charge
    assert window(chooser, lru=52, slru=51, lfu=50) and chooser.rule == "lru"
    assert not window(chooser, lru=50, slru=51, lfu=50)  # slru leads, by too little: lru stays
    assert window(chooser, lru=10, slru=20, lfu=20) and chooser.rule == "slru"  # equals: the first
    assert chooser.switches == 2


def test_a_lead_that_comes_and_goes_within_the_margin_does_not_flap() -> None:
    chooser = RuleChooser(n_moe=1, window_tokens=1, margin_permille=20)
    for i in range(50):
        window(chooser, lru=50 + (i % 2), slru=0, lfu=50 - (i % 2))
    assert chooser.switches == 0


def test_the_chooser_rejects_a_window_of_no_tokens_and_an_unknown_rule() -> None:
    with pytest.raises(ValueError):
        RuleChooser(1, window_tokens=0)
    with pytest.raises(ValueError):
        RuleChooser(1, first="arc")  # type: ignore[arg-type]


def random_requests(seed: int, n: int = 600) -> list[tuple[int, list[int], int]]:
    """Decode requests of 2 ids and, now and then, a prefill of 6 tokens routing 12."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        layer = i % 4
        if r.random() < 0.1:
            out.append((layer, [r.randrange(16) for _ in range(12)], 6))
        else:
            out.append((layer, r.sample(range(16), 2), 1))
    return out


@pytest.mark.parametrize("make", [ExpertCachePolicy, ExpertCacheCore])
@pytest.mark.parametrize("budget", [4, 9, 20])
def test_the_ghost_of_the_rule_in_charge_holds_what_the_live_cache_holds(make: type, budget: int) -> None:
    """Adaptive with a margin no rule can beat: LFU stays in charge, and with no reads ahead
    its ghost's list is the live cache's, entry for entry, after every request."""
    policy = ExpertCachePolicy(
        budget, [1] * 4, 16, eviction="adaptive", window_tokens=1, margin_permille=1001
    )
    core = ExpertCacheCore(budget, [1] * 4, 16, eviction="adaptive", window_tokens=1, margin_permille=1001)
    ghost = policy.ghosts.caches["lfu"] if policy.ghosts is not None else None
    assert isinstance(ghost, ExpertCachePolicy)
    for layer, ids, n_tokens in random_requests(budget):
        plan = policy.request(layer, ids, n_tokens)
        assert core.request(layer, ids, n_tokens) == (plan.hits, plan.evictions, plan.loads, plan.adopted)
        assert policy.resident() == ghost.resident() == core.ghost_resident("lfu") == core.resident()
    assert policy.rule == core.rule == "lfu"


def test_the_live_cache_follows_the_rule_whose_ghost_leads() -> None:
    """A recency-only routing (each layer slides along its experts): LRU and SLRU hit where
    LFU's counts are all equal; the chooser hands the cache to LRU (the first of the two),
    whose protected segment is empty, and the live cache hits as its ghost does."""
    policy = ExpertCachePolicy(4 * 5, [1] * 4, 16, eviction="adaptive", window_tokens=2)
    for token in range(400):
        for layer in range(4):
            policy.request(layer, [(token + j + 3 * layer) % 16 for j in range(2)])
            policy.check_valid()
    assert policy.ghosts is not None and policy.chooser is not None
    assert (policy.rule, policy.chooser.switches, policy.kept()) == ("lru", 1, [])
    assert policy.counters.hits >= policy.ghosts.hits["lru"] - 2 * 4 * 2  # the first window was LFU's
    assert policy.ghosts.hits["lru"] > 2 * policy.ghosts.hits["lfu"]
