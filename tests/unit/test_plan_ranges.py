"""The plan's ranges (``bmoe.domain.plan``): the published curves read at a cache's share,
every guess of the hit rate named, the decode at each end of the range, and what a
``--verify`` run kept carried into the next plan; on made-up figures."""

from __future__ import annotations

import attrs
import pytest
from test_plan import MODEL, machine  # the made-up Qwen3-30B figures of the plan's tests

from bmoe.domain.plan.decode_range import DecodeCosts, HitGuess, decode_range
from bmoe.domain.plan.figures import MIB, StreamCosts
from bmoe.domain.plan.hit_guesses import FLOOR, MEASURED, PROFILE, hit_guesses
from bmoe.domain.plan.predict import PlanSettings, make_plan
from bmoe.domain.plan.published_routing import QWEN3_235B, family_curve
from bmoe.domain.plan.verified import VerifiedRun, hit_rate_at, kept, nearest, prefill_run
from bmoe.domain.streaming.usage_profile import UsageProfile


def test_the_published_curve_is_read_at_its_points_between_them_and_beyond_them() -> None:
    assert QWEN3_235B.hit_rate(0.25) == pytest.approx(0.800)
    assert QWEN3_235B.hit_rate(0.36) == pytest.approx(0.886)
    assert QWEN3_235B.hit_rate(0.225) == pytest.approx((0.743 + 0.800) / 2)
    assert QWEN3_235B.hit_rate(0.025) == pytest.approx(0.339 / 2)  # a line from nothing cached
    assert QWEN3_235B.hit_rate(0.0) == 0.0 and QWEN3_235B.hit_rate(2.0) == pytest.approx(0.979)
    assert family_curve("qwen3moe") is QWEN3_235B and family_curve("olmoe") is None


def test_the_guesses_name_the_floor_the_family_and_the_profile_and_expect_the_best_informed() -> None:
    quarter = MODEL.expert_bytes // 4
    guesses, expected = hit_guesses(MODEL, quarter)
    assert [g.name for g in guesses] == [FLOOR, QWEN3_235B.name] and expected.name == FLOOR
    assert guesses[0].rate == pytest.approx(0.25) and guesses[1].rate == pytest.approx(0.80)
    counts = tuple(100.0 if e < 8 else 1.0 for _ in MODEL.moe_layers for e in range(128))
    profile = UsageProfile("key", 48, 128, counts)
    guesses, expected = hit_guesses(MODEL, quarter, profile)
    assert expected.name == PROFILE and expected.rate > 0.8 and len(guesses) == 3
    other = attrs.evolve(MODEL, arch="olmoe")
    assert [g.name for g in hit_guesses(other, quarter)[0]] == [FLOOR]


def test_a_step_is_the_resident_step_plus_its_reads_plus_their_cpu() -> None:
    costs = DecodeCosts(
        100 * MIB, disk_mib_s=400.0, resident_step_s=0.02, cpu_s_per_mib=0.0005, cpu_source="x"
    )
    at_half = costs.at(0.5)
    assert at_half.read_bytes == 50 * MIB
    assert at_half.step_s == pytest.approx(0.02 + 50 / 400 + 50 * 0.0005)
    r = decode_range(costs, [HitGuess("a", 0.2), HitGuess("b", 0.7), HitGuess("c", 0.5)], HitGuess("c", 0.5))
    assert r.low.hit_rate == 0.2 and r.high.hit_rate == 0.7 and r.expected.hit_rate == 0.5
    assert r.low.tok_s < r.expected.tok_s < r.high.tok_s


def test_the_streamed_calibration_s_cost_a_mib_slows_the_plan_s_decode_and_prefill() -> None:
    plain = make_plan(MODEL, machine(14), PlanSettings())
    costly_machine = attrs.evolve(machine(14), stream_costs=StreamCosts(0.0005, 0.002, "timed here"))
    costly = make_plan(MODEL, costly_machine, PlanSettings())
    assert costly.costs.cpu_s_per_mib == 0.0005 and costly.costs.cpu_source == "timed here"
    assert costly.decode_tok_s < plain.decode_tok_s
    assert costly.prefills[0].seconds > plain.prefills[0].seconds


def test_the_prefill_s_flops_are_read_at_the_tokens_each_expert_gets() -> None:
    curved = attrs.evolve(machine(14), matmul_curve=((16.0, 100e9), (64.0, 200e9), (256.0, 400e9)))
    assert curved.matmul_flops_at(8) == 100e9 and curved.matmul_flops_at(1000) == 400e9
    assert curved.matmul_flops_at(40) == pytest.approx(150e9)
    slow, fast = (
        make_plan(MODEL, attrs.evolve(curved, matmul_curve=((1.0, f), (1000.0, f))), PlanSettings())
        for f in (100e9, 400e9)
    )
    assert slow.prefills[0].seconds > fast.prefills[0].seconds


RUN = VerifiedRun(
    cache_share=0.25,
    hit_rate=0.6,
    read_mib_token=400.0,
    tok_s=0.5,
    disk_mib_s=400.0,
    resident_step_s=0.1,
    prefill_tokens=2048,
    prefill_s=60.0,
    where="--mem-limit-mb 4096",
)


def test_a_verified_run_gives_the_cpu_a_mib_read_costs() -> None:
    # 2 s a step = 0.1 resident + 1.0 reading 400 MiB at 400 MiB/s + 0.9 s over 400 MiB
    assert RUN.cpu_s_per_mib == pytest.approx(0.9 / 400)
    assert attrs.evolve(RUN, tok_s=10.0).cpu_s_per_mib == 0.0  # never below nothing


def test_a_verified_hit_rate_is_carried_to_another_share_by_the_reference() -> None:
    assert hit_rate_at(RUN, 0.26, None) == 0.6  # the same cache
    assert hit_rate_at(RUN, 0.5, None) == pytest.approx(1.0)  # twice the share, capped
    assert hit_rate_at(RUN, 0.125, None) == pytest.approx(0.3)
    assert hit_rate_at(RUN, 0.5, lambda s: 0.5 + s) == pytest.approx(0.6 * 1.0 / 0.75)


def test_the_nearest_run_serves_and_one_run_a_share_and_place_is_kept() -> None:
    other = attrs.evolve(RUN, cache_share=0.5, hit_rate=0.8)
    assert nearest([RUN, other], 0.45) is other and nearest([], 0.3) is None
    newer = attrs.evolve(RUN, hit_rate=0.65)
    assert kept([RUN, other], newer) == (other, newer)
    elsewhere = attrs.evolve(RUN, where="no memory limit")
    assert kept([RUN], elsewhere) == (RUN, elsewhere)
    assert prefill_run([RUN, other], 0.25, 2000) is RUN and prefill_run([other], 0.25, 2000) is other
    assert prefill_run([attrs.evolve(RUN, prefill_s=0.0)], 0.25, 2048) is None


def test_the_next_plan_predicts_from_what_verify_measured() -> None:
    settings = PlanSettings(cache_mb=MODEL.expert_bytes // 4 // MIB, prompt_tokens=(2048,))
    before = make_plan(MODEL, machine(14), settings)
    after = make_plan(MODEL, machine(14), settings, verified=(RUN,))
    assert after.decode.expected_guess.name == MEASURED and after.decode.expected.hit_rate == 0.6
    assert after.costs.cpu_s_per_mib == pytest.approx(RUN.cpu_s_per_mib)
    assert after.prefills[0].seconds == pytest.approx(RUN.prefill_s)  # the same prompt: as measured
    assert before.prefills[0].seconds != pytest.approx(RUN.prefill_s)
    longer = make_plan(MODEL, machine(14), attrs.evolve(settings, prompt_tokens=(4096,)), verified=(RUN,))
    assert longer.prefills[0].seconds > RUN.prefill_s  # carried by the ratio of today's figures


def test_a_prompt_s_attention_scores_grow_with_its_square_and_with_smaller_batches_less() -> None:
    heads = attrs.evolve(MODEL, n_head=32, head_dim=128, n_attn_layers=16)
    whole = heads.attention_flops(2048, 2048)
    assert whole == 4 * 32 * 128 * 16 * 2048 * 2048  # 1.1 TFLOP: the figure its docstring quotes
    assert heads.attention_flops(1024, 1024) == whole / 4
    batched = heads.attention_flops(2048, 512)  # each batch against the cells so far
    assert batched == 4 * 32 * 128 * 16 * 512 * (512 + 1024 + 1536 + 2048)
    assert MODEL.attention_flops(2048, 2048) == 0.0  # head width unknown: no term


def test_the_attention_rate_is_how_a_long_prompts_batches_grow() -> None:
    from bmoe.runtime.compute_calibration import PREFILL_TOKENS, attention_rate

    heads = attrs.evolve(MODEL, n_head=32, head_dim=128, n_attn_layers=2)
    rate, weights_s, batch = 50e9, 0.4, PREFILL_TOKENS

    def scores(i: int) -> float:  # batch i's queries against the cells so far
        return heads.attention_flops((i + 1) * batch, batch) - heads.attention_flops(i * batch, batch)

    seconds = tuple(weights_s + scores(i) / rate for i in range(4))
    assert attention_rate(heads, seconds, batch) == pytest.approx(rate)
    noisy = tuple(t + d for t, d in zip(seconds, (0.01, -0.01, 0.01, -0.01), strict=True))
    assert attention_rate(heads, noisy, batch) == pytest.approx(rate, rel=0.25)
    assert attention_rate(heads, (weights_s,) * 4, batch) == 0.0  # no growth: not measured
    assert attention_rate(heads, (0.7, 0.6, 0.5, 0.4), batch) == 0.0  # shrinking: not measured
    assert attention_rate(heads, seconds[:1], batch) == 0.0  # one batch: no slope


def test_a_measured_attention_rate_lengthens_the_prefill_of_a_long_prompt() -> None:
    heads = attrs.evolve(MODEL, n_head=32, head_dim=128, n_attn_layers=48)
    settings = PlanSettings(prompt_tokens=(2048,))
    plain = make_plan(heads, machine(14), settings)
    slow = make_plan(heads, attrs.evolve(machine(14), attention_flops_s=50e9), settings)
    assert slow.prefills[0].seconds > plain.prefills[0].seconds


def test_the_prefills_range_carries_the_calibrations_spread() -> None:
    from bmoe.runtime.compute_calibration import spread

    assert spread([[1.0, 1.2, 0.9], [2.0, 2.4, 1.8]]) == pytest.approx((0.9, 1.2))
    assert spread([]) == (1.0, 1.0)
    heads = attrs.evolve(MODEL, n_head=32, head_dim=128, n_attn_layers=48)
    settings = PlanSettings(prompt_tokens=(2048,))
    steady = make_plan(heads, machine(14), settings).prefills[0]
    moving = make_plan(heads, attrs.evolve(machine(14), compute_spread=(0.8, 1.3)), settings).prefills[0]
    assert moving.seconds == steady.seconds  # the expected figure is the medians'
    assert steady.fastest_s == steady.seconds
    assert moving.fastest_s < moving.seconds < moving.slowest_s
    assert moving.slowest_s > steady.slowest_s


def test_the_prefills_range_spans_the_machine_s_recent_calibrations_rates() -> None:
    """Rates read off a calibration's timings move between calibrations more than its total
    time: the range counts the prompt at each recent calibration's rates too."""
    from bmoe.domain.plan.prompt_rates import PromptRates

    heads = attrs.evolve(MODEL, n_head=32, head_dim=128, n_attn_layers=48)
    settings = PlanSettings(prompt_tokens=(2048,))
    today = attrs.evolve(machine(14), matmul_curve=((1.0, 200e9), (64.0, 200e9)), attention_flops_s=100e9)
    steady = make_plan(heads, today, settings).prefills[0]
    faster, slower = PromptRates(((1.0, 400e9),), 200e9), PromptRates(((1.0, 100e9),), 50e9)
    spanned = make_plan(heads, attrs.evolve(today, recent_rates=(faster, slower)), settings).prefills[0]
    assert spanned.seconds == steady.seconds  # today's rates give the expected figure
    assert spanned.fastest_s < steady.fastest_s and spanned.slowest_s > steady.slowest_s
    only_fast = make_plan(heads, attrs.evolve(today, recent_rates=(faster,)), settings).prefills[0]
    assert only_fast.slowest_s == steady.slowest_s  # a faster earlier calibration widens one end
    # a prompt at twice the FLOP/s of both kinds takes half the compute
    half = attrs.evolve(today, matmul_curve=((1.0, 400e9),), attention_flops_s=200e9)
    assert make_plan(heads, half, settings).prefills[0].seconds == pytest.approx(only_fast.fastest_s)
