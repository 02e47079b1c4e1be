"""``--decide-prefix-cache auto`` under streaming: keep the state after a new prefix only where
the compute it saves the next decision pays for the reads a second piece adds now."""

from __future__ import annotations

import math

import pytest

from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, LastPrefixCache
from bmoe.domain.decide.piece_policy import (
    PRIOR_READ_BYTES_S,
    PieceCosts,
    PieceMeter,
    choose_pieces,
    routed_share,
    second_piece_reads_s,
)
from bmoe.service.decider import run_decide
from bmoe.testing.fake_decide_backend import ScriptedDecideBackend

AUTO = DecideConfig(enabled=True)
ON = DecideConfig(enabled=True, prefix_cache="on")
ABC = ("A", "B", "C")
TASK = "Task: turn on Wi-Fi. History: none. "
MORE = "Task: turn on Wi-Fi. History: none. Opened Settings. "
SCREEN = "Screen: Settings. Options: A) Network B) Display C) Battery."
STREAMED = PieceCosts(compute_s_per_token=0.01, miss_read_s=2.0, n_expert=128, n_expert_used=8)


def test_the_routed_share_grows_to_every_expert() -> None:
    assert routed_share(0, 128, 8) == 0.0
    assert routed_share(1, 128, 8) == pytest.approx(8 / 128)
    assert routed_share(30, 128, 8) == pytest.approx(1 - (120 / 128) ** 30)
    assert routed_share(500, 128, 8) == pytest.approx(1.0)
    assert routed_share(3, 4, 8) == 1.0  # top-k of all experts


def test_a_second_piece_reads_what_two_shares_overlap_in_one() -> None:
    extra = second_piece_reads_s(30, 60, STREAMED)
    share = [routed_share(t, 128, 8) for t in (30, 60, 90)]
    assert extra == pytest.approx(2.0 * (share[0] + share[1] - share[2]))
    assert second_piece_reads_s(30, 60, PieceCosts(0.01, miss_read_s=0.0)) == 0.0  # resident / all cached
    assert second_piece_reads_s(0, 60, STREAMED) == 0.0


def test_resident_or_fully_cached_keeps_the_prefix() -> None:
    choice = choose_pieces(0, 100, 140, PieceCosts(compute_s_per_token=0.01))
    assert choice.keep and "reads nothing" in choice.why


def test_streamed_a_short_new_prefix_is_not_worth_a_second_read() -> None:
    choice = choose_pieces(300, 360, 420, STREAMED)  # 60 new tokens save 0.6 s, cost ~1.9 s
    assert not choice.keep and choice.why.startswith("one piece")


def test_streamed_a_long_new_prefix_is_worth_it() -> None:
    choice = choose_pieces(0, 400, 460, STREAMED)  # 400 tokens save 4 s
    assert choice.keep and choice.why.startswith("kept")


def test_before_any_measurement_one_piece() -> None:
    choice = choose_pieces(0, 400, 460, PieceCosts(None, miss_read_s=2.0, n_expert=128, n_expert_used=8))
    assert not choice.keep and "no compute measured" in choice.why


def test_the_meter_keeps_the_latest_read_rate_and_the_least_compute_after_the_first() -> None:
    meter = PieceMeter(expert_bytes=5 << 30, n_expert=128, n_expert_used=8)
    assert meter.costs(1 << 30).miss_read_s == pytest.approx(4.0 * (1 << 30) / PRIOR_READ_BYTES_S)
    # the session's first prefill: its compute is not trusted (first touches), its reads are
    meter.observe(n_prefilled=100, prefill_s=18.0, stall_s=4.0, bytes_read=4 << 30)
    assert meter.costs(3 << 30).compute_s_per_token is None
    assert meter.costs(3 << 30).miss_read_s == pytest.approx(2.0)  # 2 GiB missing at 1 GiB/s
    meter.observe(n_prefilled=100, prefill_s=3.0, stall_s=2.0, bytes_read=2 << 30)
    costs = meter.costs(3 << 30)
    assert costs.compute_s_per_token == pytest.approx(0.01)
    assert costs.miss_read_s == pytest.approx(2.0)  # 2 GiB missing at 1 GiB/s measured
    assert meter.costs(6 << 30).miss_read_s == 0.0  # the cache holds every expert
    meter.observe(n_prefilled=0, prefill_s=0.0, stall_s=0.0, bytes_read=0)  # nothing new
    assert meter.costs(3 << 30) == costs
    meter.observe(n_prefilled=100, prefill_s=5.0, stall_s=2.0, bytes_read=1 << 30)  # slower: not kept
    assert meter.costs(3 << 30).compute_s_per_token == pytest.approx(0.01)
    assert meter.costs(3 << 30).miss_read_s == pytest.approx(4.0)  # the latest rate: 0.5 GiB/s
    meter.observe(n_prefilled=100, prefill_s=2.5, stall_s=2.0, bytes_read=1 << 30)  # faster: kept
    assert meter.costs(3 << 30).compute_s_per_token == pytest.approx(0.005)


def decide(
    backend: ScriptedDecideBackend,
    cache: LastPrefixCache,
    prefix: str,
    costs: PieceCosts | None,
    config: DecideConfig = AUTO,
) -> DecideResult:
    return run_decide(
        backend, cache, DecideRequest(prefix=prefix, suffix=SCREEN, choices=ABC), config, costs=costs
    )


def test_one_piece_keeps_the_older_state_and_prefills_the_rest_at_once() -> None:
    backend, cache = ScriptedDecideBackend(), LastPrefixCache()
    first = decide(backend, cache, TASK, None)
    assert first.n_stored > 0 and first.prefix_plan == ""  # no costs given: kept as before
    kept = cache.kept()
    backend.calls.clear()
    second = decide(backend, cache, MORE, STREAMED)
    assert not second.prefix_plan.startswith("kept") and second.n_stored == 0
    assert second.n_reused == first.n_stored
    prefills = [c for c in backend.calls if c[0] == "prefill"]
    assert prefills == [("prefill", second.n_reused, second.n_prefilled)]  # one piece
    assert cache.kept() == kept  # the older state stays
    reference = run_decide(
        ScriptedDecideBackend(),
        LastPrefixCache(),
        DecideRequest(prefix=MORE, suffix=SCREEN, choices=ABC),
        DecideConfig(enabled=True, prefix_cache="off"),
    )
    assert second.choice_logp == reference.choice_logp  # the fake computes per token: same scores


def test_on_keeps_whatever_the_costs() -> None:
    backend, cache = ScriptedDecideBackend(), LastPrefixCache()
    decide(backend, cache, TASK, STREAMED, ON)
    grown = decide(backend, cache, MORE, STREAMED, ON)
    assert grown.n_stored > grown.n_reused > 0 and grown.prefix_plan == ""


def test_the_policy_says_why_in_the_result() -> None:
    backend, cache = ScriptedDecideBackend(), LastPrefixCache()
    result = decide(
        backend,
        cache,
        TASK,
        PieceCosts(compute_s_per_token=1.0, miss_read_s=0.5, n_expert=128, n_expert_used=8),
    )
    assert result.n_stored > 0 and result.prefix_plan.startswith("kept: the next decision skips")
    assert not math.isnan(result.choice_logp[0])
