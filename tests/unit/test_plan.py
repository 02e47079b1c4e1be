"""The planner's arithmetic (``bmoe.domain.plan``): hit rates, fit, the cache that cycles,
the flags, on made-up figures."""

from __future__ import annotations

import attrs
import pytest

from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.plan.figures import MIB, MachineFigures, ModelFigures
from bmoe.domain.plan.hit_rate import profile_hit_rate, uniform_hit_rate
from bmoe.domain.plan.predict import PlanSettings, make_plan
from bmoe.domain.streaming.usage_profile import UsageProfile

GIB = 1024 * MIB
# Qwen3-30B-A3B at Q4_K_M, roughly: 48 layers of 128 experts, top-8
MODEL = ModelFigures(
    name="qwen3-30b.gguf",
    arch="qwen3moe",
    file_bytes=18 * GIB,
    n_layer=48,
    moe_layers=tuple(range(48)),
    n_expert=128,
    n_expert_used=8,
    expert_bytes=16 * GIB,
    entry_bytes=16 * GIB // (48 * 128),
    layer_bytes=16 * GIB // 48,
    token_cycle_bytes=16 * GIB // 16,
    read_bytes=16 * GIB // (48 * 128 * 3),
    kv_bytes_per_token=96 * 1024,
    n_embd=2048,
    n_vocab=151936,
    n_head=32,
    n_ff_exp=768,
    n_ctx_train=40960,
    bytes_per_weight=0.56,
)


def machine(room_gib: float, disk: float = 400.0) -> MachineFigures:
    room = int(room_gib * GIB)
    return MachineFigures(
        room=MemoryRoom(room, room, limit_bytes=room, group_room_bytes=room),
        disk_mib_s=disk,
        disk_source="--disk-mib-s",
        matvec_bytes_s=20e9,
        matmul_flops=200e9,
        cores=8,
    )


def test_uniform_routing_hits_the_share_held_below_k_experts_a_layer_too() -> None:
    """Independent uniform routing hits c / n whatever the cache evicts: only routing that
    repeats makes an LRU below one token's working set cycle (the 48-layer bench model with
    7.7 of a layer's 8 held hit 50.4%, where this floor said 0)."""
    below = uniform_hit_rate(MODEL.token_cycle_bytes - 1, MODEL.expert_bytes, 128)
    assert below == pytest.approx(8 / 128, rel=1e-6)
    assert uniform_hit_rate(MODEL.expert_bytes // 2, MODEL.expert_bytes, 128) == 0.5
    assert uniform_hit_rate(2 * MODEL.expert_bytes, MODEL.expert_bytes, 128) == 1.0


def test_a_skewed_profile_predicts_more_hits_than_uniform_routing() -> None:
    counts = [100.0 if e < 4 else 1.0 for _ in range(2) for e in range(16)]
    profile = UsageProfile("key", 2, 16, tuple(counts))
    assert profile_hit_rate(profile, 4, [0, 1]) == 400 / 412
    assert profile_hit_rate(profile, 16, [0, 1]) == 1.0


def test_a_16_gib_laptop_streams_it_with_an_auto_cache_and_says_which_bound() -> None:
    plan = make_plan(MODEL, machine(14), PlanSettings())
    assert not plan.resident_fits and plan.streamed_fits and not plan.cycles
    assert plan.n_ctx == 24576  # the 20,000-token prompt + 4096, to a multiple of 1024
    assert 0 < plan.hit_rate < 1 and plan.read_bytes_per_token < MODEL.token_cycle_bytes
    # a step is the resident step plus its reads (no CPU a MiB counted: none measured here)
    assert plan.decode_tok_s == pytest.approx(1 / (1 / plan.disk_tok_s + 1 / plan.compute_tok_s))
    assert plan.decode.low.tok_s <= plan.decode_tok_s <= plan.decode.high.tok_s
    assert plan.decode_bound == "disk"
    flags = plan.flags()
    assert flags[:3] == ["--moe-stream", "--cache-mb", "auto"] and plan.cache_mb == plan.budget.bytes // MIB
    assert flags[flags.index("-c") + 1] == "24576" and "-b" not in flags  # sized by the run itself
    assert [p.tokens for p in plan.prefills] == [2048, 20000]
    assert plan.prefills[1].seconds > plan.prefills[0].seconds


def test_a_cache_below_one_tokens_working_set_is_said_plainly() -> None:
    plan = make_plan(MODEL, machine(14), PlanSettings(cache_mb=100))
    assert plan.cycles and plan.hit_rate == pytest.approx(100 / (16 * 1024))  # the share held
    assert plan.read_bytes_per_token == pytest.approx(MODEL.token_cycle_bytes * (1 - plan.hit_rate))
    assert any("below one token's working set" in note and "cycles" in note for note in plan.notes())


def test_a_model_that_does_not_fit_even_streamed_says_what_would() -> None:
    plan = make_plan(MODEL, machine(2.5), PlanSettings(n_ctx=32768))
    assert not plan.streamed_fits
    (note,) = [n for n in plan.notes() if "does not fit even streamed" in n]
    assert "-c " in note or "needs about" in note
    tiny_room = make_plan(MODEL, machine(1), PlanSettings(n_ctx=4096))
    assert any("needs about" in n for n in tiny_room.notes())


def test_a_machine_with_room_for_everything_fits_resident_and_caps_the_cache_flag() -> None:
    plan = make_plan(attrs.evolve(MODEL), machine(64), PlanSettings(n_parallel=2, cache_disk="/tmp/states"))
    assert plan.resident_fits and plan.hit_rate == 1.0 and plan.flags()[2] == "auto"
    asked = PlanSettings(cache_mb=64 * 1024, n_parallel=2, cache_disk="/tmp/states")
    flags = make_plan(MODEL, machine(64), asked).flags()
    assert int(flags[2]) == MODEL.expert_bytes // MIB
    assert flags[-4:] == ["-np", "2", "--cache-disk", "/tmp/states"]


def test_the_compute_calibration_takes_the_quantization_nearest_the_experts() -> None:
    from bmoe.runtime.compute_calibration import calibration_quant

    assert calibration_quant(18 / 32) == "q4_0"  # Q4_0 (and Q4_K, as many bytes a weight)
    assert calibration_quant(34 / 32) == "q8_0"
    assert calibration_quant(4.0) == "q8_0"  # F32 experts: the widest it has
    assert calibration_quant(0.3) == "q4_0"
