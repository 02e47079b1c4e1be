"""The memory-pressure governor's decisions on scripted readings: shrink at once below the
watermark or under pressure (from what the cache holds, never below the floor), grow slowly
after calm readings and not right after a shrink, never past the ceiling."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming.governor import GovernorConfig, MemoryGovernor, MemoryReading

MIB = 1024 * 1024
GIB = 1024 * MIB
USABLE = 8 * GIB


def governor(**kw: object) -> MemoryGovernor:
    args: dict[str, object] = {"floor_bytes": 512 * MIB, "ceil_bytes": 4 * GIB} | kw
    return MemoryGovernor(GovernorConfig(**args))  # type: ignore[arg-type]


def reading(free_mib: float, pressure: float | None = None) -> MemoryReading:
    return MemoryReading(room_bytes=int(free_mib * MIB), usable_bytes=USABLE, pressure_pct=pressure)


def test_short_memory_shrinks_back_to_comfort_from_what_the_cache_holds() -> None:
    g = governor()
    change = g.observe(reading(100), budget_bytes=4 * GIB, resident_bytes=3 * GIB)
    assert change is not None and change.shrinks
    # 100 MiB free, comfort 1 GiB: give back 924 MiB below the 3 GiB held
    assert change.after == 3 * GIB - 924 * MIB
    assert "shrink" in change.why and "100 MiB free, 1% of 8,192 MiB" in change.why


def test_a_small_shortfall_still_gives_back_a_step() -> None:
    change = governor().observe(reading(900), budget_bytes=4 * GIB, resident_bytes=4 * GIB)
    assert change is None  # 900 MiB free: above the shrink mark (512), nothing moves
    change = governor().observe(reading(500), budget_bytes=4 * GIB, resident_bytes=4 * GIB)
    assert change is not None and change.after == 4 * GIB - 524 * MIB
    change = governor(step_bytes=600 * MIB).observe(reading(500), 4 * GIB, 4 * GIB)
    assert change is not None and change.after == 4 * GIB - 600 * MIB


def test_pressure_shrinks_even_with_room() -> None:
    change = governor().observe(reading(4000, pressure=25.0), budget_bytes=2 * GIB, resident_bytes=2 * GIB)
    assert change is not None and change.after == 2 * GIB - 256 * MIB
    assert "memory pressure 25.0%" in change.why


def test_never_below_the_floor_and_silent_there() -> None:
    g = governor()
    change = g.observe(reading(10), budget_bytes=1 * GIB, resident_bytes=1 * GIB)
    assert change is not None and change.after == 512 * MIB
    assert g.observe(reading(10), budget_bytes=512 * MIB, resident_bytes=512 * MIB) is None


def test_between_the_watermarks_nothing_moves() -> None:
    g = governor()
    for _ in range(20):
        assert g.observe(reading(1500), budget_bytes=2 * GIB, resident_bytes=2 * GIB) is None


def test_growth_waits_for_calm_readings_then_steps() -> None:
    g = governor(grow_after=3)
    assert g.observe(reading(3000), 2 * GIB, 2 * GIB) is None
    assert g.observe(reading(3000), 2 * GIB, 2 * GIB) is None
    change = g.observe(reading(3000), 2 * GIB, 2 * GIB)
    assert change is not None and change.after == 2 * GIB + 256 * MIB and not change.shrinks
    assert g.observe(reading(3000), change.after, 2 * GIB) is None  # calm counts again from zero


def test_no_growth_right_after_a_shrink() -> None:
    g = governor(grow_after=1, cooldown=5)
    assert g.observe(reading(50), 2 * GIB, 2 * GIB) is not None
    for _ in range(5):
        assert g.observe(reading(6000), 1 * GIB, 1 * GIB) is None
    assert g.observe(reading(6000), 1 * GIB, 1 * GIB) is not None


def test_growth_stops_at_the_ceiling_and_leaves_the_comfort_room() -> None:
    g = governor(grow_after=1, cooldown=0)
    change = g.observe(reading(6000), 4 * GIB - 100 * MIB, 0)
    assert change is not None and change.after == 4 * GIB
    assert g.observe(reading(6000), 4 * GIB, 0) is None
    near = MemoryReading(room_bytes=GIB + 10 * MIB, usable_bytes=USABLE)
    g2 = governor(grow_after=1, cooldown=0, grow_above_bytes=GIB + 1)
    change2 = g2.observe(near, GIB, GIB)
    assert change2 is not None and change2.after - GIB <= 10 * MIB + 1


@pytest.mark.parametrize(
    "bad",
    [
        {"floor_bytes": 5 * GIB},
        {"shrink_below_bytes": 2 * GIB},
        {"step_bytes": 0},
        {"grow_after": 0},
    ],
)
def test_a_config_that_cannot_work_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        governor(**bad)


def test_watermarks_around_a_cgroups_thin_reserve_leave_the_start_budget_alone() -> None:
    """``auto`` keeps a 148 MiB margin in a 2 GiB cgroup, of which the run itself uses about half:
    the governor's comfort is half that reserve, so the start budget is not shrunk at once (a
    fixed 512 MiB shrink mark would: measured, 55 MiB free with the cache full)."""
    config = GovernorConfig.around(148 * MIB, floor_bytes=64 * MIB, ceil_bytes=1500 * MIB)
    assert (config.shrink_below_bytes, config.comfort_bytes, config.grow_above_bytes, config.step_bytes) == (
        37 * MIB,
        74 * MIB,
        148 * MIB,
        74 * MIB,
    )
    g = MemoryGovernor(config)
    assert g.observe(reading(55), budget_bytes=1500 * MIB, resident_bytes=1500 * MIB) is None
    change = g.observe(reading(20), budget_bytes=1500 * MIB, resident_bytes=1500 * MIB)
    assert change is not None and change.after == 1500 * MIB - 74 * MIB  # a step of half the reserve
    wide = GovernorConfig.around(1536 * MIB, floor_bytes=0, ceil_bytes=8 * GIB)
    assert (wide.shrink_below_bytes, wide.comfort_bytes, wide.step_bytes) == (384 * MIB, 768 * MIB, 256 * MIB)


def test_a_group_at_its_limit_steps_down_and_never_grows_back_to_it() -> None:
    """The process's own group hit its limit (the kernel reclaimed inside it): a step down at
    once, whatever the room says, and later growth stops below the budget that hit it."""
    g = MemoryGovernor(GovernorConfig.around(84 * MIB, floor_bytes=324 * MIB, ceil_bytes=3347 * MIB))
    hit = MemoryReading(room_bytes=60 * MIB, usable_bytes=4 * GIB, limit_hits=152)
    change = g.observe(hit, budget_bytes=3347 * MIB, resident_bytes=3346 * MIB)
    assert change is not None and change.after == 3346 * MIB - 42 * MIB
    assert change.why == "shrink: the memory group hit its limit 152 times"
    roomy = MemoryReading(room_bytes=500 * MIB, usable_bytes=4 * GIB)
    grown = [g.observe(roomy, change.after - 100 * MIB, change.after - 100 * MIB) for _ in range(20)]
    assert max(c.after for c in grown if c is not None) <= change.after
