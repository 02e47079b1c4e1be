"""The budget against the memory room: an explicit budget that cannot fit is said with the
figures and what would fit; ``auto`` counts the dense part and the KV cache once (they are in
the room's reading) and subtracts the compute buffer still to come; the ``mode:`` line shows
that arithmetic."""

from __future__ import annotations

import attrs

from bmoe.domain.memory_room import CgroupLevel, MemoryRoom
from bmoe.domain.streaming import MIB, RunMemory, StreamConfig, resolve_budget
from bmoe.domain.streaming.headroom import machine_floor_bytes, run_margin_bytes
from bmoe.domain.summary import stream_mode_line

GIB = 1 << 30
# the run: a 2 GiB group, the dense part and the KV cache of -c 4096 already in it
IN_GROUP = MemoryRoom.of(21957 * MIB, 24 * GIB, [CgroupLevel(2 * GIB, 700 * MIB)], "/bench/run1")
RUN = RunMemory(IN_GROUP, dense_bytes=212 * MIB, kv_bytes=384 * MIB, compute_buffer_bytes=round(87.0 * MIB))


def test_an_explicit_budget_that_cannot_fit_says_so_with_the_figures() -> None:
    budget = resolve_budget(StreamConfig(enabled=True, cache_mb=1536), memory=RUN, token_cycle_bytes=MIB)
    assert budget.bytes == 1536 * MIB  # honoured: the user may know better
    assert budget.warning == (
        "cache 1536 MiB + dense 212 + KV 384 + compute buffer 87.0 = 2219 MiB, more than the room "
        "of 1944 MiB (under a cgroup limit of 2048 MiB): the kernel may kill the process; at most "
        "--cache-mb 1261 fits (--cache-mb auto: 64 MiB kept free in the cgroup besides)"
    )


def test_an_explicit_budget_that_fits_says_nothing() -> None:
    fits = resolve_budget(StreamConfig(enabled=True, cache_mb=1261), memory=RUN, token_cycle_bytes=MIB)
    assert fits.warning is None
    over = resolve_budget(StreamConfig(enabled=True, cache_mb=1262), memory=RUN, token_cycle_bytes=MIB)
    assert over.warning is not None and "at most --cache-mb 1261 fits" in over.warning
    off = resolve_budget(StreamConfig(enabled=True, cache_mb=0), memory=RUN, token_cycle_bytes=MIB)
    assert off.warning is None


def test_a_budget_below_a_cycle_and_beyond_the_room_is_one_line() -> None:
    tiny = RunMemory(MemoryRoom(10 * MIB))
    both = resolve_budget(StreamConfig(enabled=True, cache_mb=50), memory=tiny, token_cycle_bytes=100 * MIB)
    assert both.warning is not None and "\n" not in both.warning
    first, second = both.warning.split("; ", 1)
    assert first.endswith("the cache cycles, expect few hits") and second.startswith("cache 50 MiB + dense 0")


def test_auto_counts_the_dense_part_and_the_kv_cache_once() -> None:
    """They are in the room's reading already: only the compute buffer and the run's margin
    in its cgroup go (the machine's 21957 MiB available bind nothing here)."""
    auto = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=MIB)
    assert auto.bytes == 1348 * MIB - round(87.0 * MIB) - 64 * MIB
    assert auto.bytes < RUN.cache_fits_bytes  # so auto never draws the warning above


def test_the_mode_line_shows_the_room_and_what_was_subtracted() -> None:
    auto = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=MIB)
    assert stream_mode_line(auto, 4, True, 512) == (
        "mode: expert streaming, cache 1197 MiB (auto = room 1348 - compute buffer 87.0 - 64 MiB kept "
        "free in the cgroup; the room: under a cgroup limit of 2048 MiB, after dense 212 + KV 384 MiB), "
        "4 lanes, O_DIRECT, prompt batch 512"
    )
    starved = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=1200 * MIB)
    line = stream_mode_line(starved, 4, True, 512)
    assert "; below one token cycle: the room holds no more; the room:" in line
    assert starved.warning is not None and "killed" not in starved.warning
    assert "below one token's working set (1200 MiB): the cache cycles" in starved.warning
    capped = resolve_budget(StreamConfig(enabled=True, cache_ceil_mb=100), memory=RUN, token_cycle_bytes=MIB)
    assert "; capped at --cache-ceil-mb 100; the room:" in stream_mode_line(capped, 4, True, 512)


def test_auto_keeps_the_runs_margin_in_its_cgroup_and_a_floor_sized_from_the_machine() -> None:
    """Inside a cgroup the room is the run's own: ``auto`` keeps the run's margin (the lanes'
    reads in flight and a slack), not a fixed GiB; outside, the floor left to the machine is
    sized from MemTotal (512 MiB on a 4 GiB phone, 2 GiB on a 64 GiB desktop)."""
    lanes = RunMemory(IN_GROUP, compute_buffer_bytes=87 * MIB, run_margin_bytes=run_margin_bytes(4, 3 * MIB))
    auto = resolve_budget(StreamConfig(enabled=True), memory=lanes, token_cycle_bytes=MIB)
    assert auto.bytes == (1348 - 87 - 64 - 4 * 2 * 3) * MIB
    assert "- 88 MiB kept free in the cgroup;" in auto.arithmetic()
    for total_gib, floor_mib in ((4, 512), (8, 512), (24, 1536), (64, 2048)):
        assert machine_floor_bytes(total_gib * GIB) == floor_mib * MIB
        phone = RunMemory(MemoryRoom(3 * GIB, total_gib * GIB))
        assert (
            resolve_budget(StreamConfig(enabled=True), memory=phone, token_cycle_bytes=MIB).bytes
            == (3072 - floor_mib) * MIB
        )


def test_the_limit_that_leaves_less_binds() -> None:
    """A cgroup whose limit is above what the machine has free binds nothing: the machine's
    floor applies; the prompt cache's memory tier is set aside beside either."""
    loose = MemoryRoom.of(1500 * MIB, 24 * GIB, [CgroupLevel(8 * GIB, 100 * MIB)], "/user.slice")
    memory = RunMemory(loose, prompt_states_bytes=512 * MIB)
    assert memory.headroom.limit == "machine"
    budget = resolve_budget(StreamConfig(enabled=True), memory=memory, token_cycle_bytes=MIB)
    assert budget.bytes == 0 + MIB  # 1500 - 1536 left to the machine: only the token cycle
    assert RunMemory(IN_GROUP).headroom.limit == "cgroup"
    states = resolve_budget(
        StreamConfig(enabled=True),
        memory=attrs.evolve(RUN, prompt_states_bytes=512 * MIB),
        token_cycle_bytes=MIB,
    )
    assert states.bytes == (1348 - 87 - 512 - 64) * MIB
    assert "- compute buffer 87.0 - prompt cache 512 - 64 MiB kept free in the cgroup;" in states.arithmetic()


def test_auto_short_of_a_cycle_in_a_cgroup_stays_in_the_room() -> None:
    """As the 48-layer bench model at -c 4096 in 2 GiB: the room leaves the cache less than
    one token cycle. Raised to the cycle (972 MiB) past the room, that run was killed by its
    first prompt ubatch; auto now takes what the room leaves, at least two layers' k experts."""
    cycle, two_layers = 1300 * MIB, 40 * MIB
    short = resolve_budget(AUTO_CFG, memory=RUN, token_cycle_bytes=cycle, least_bytes=two_layers)
    assert short.bytes == (1348 - 87 - 64) * MIB  # the room, not the cycle
    assert short.floor_bytes == two_layers  # the governor and the room read again hold it to two layers
    assert "the cache cycles, expect few hits" in (short.warning or "")
    assert "-c (the KV cache takes 384 MiB)" in (short.warning or "")
    # a room that leaves less than two layers: two layers all the same, and it says what it risks
    tight = attrs.evolve(RUN, compute_buffer_bytes=1270 * MIB)
    least = resolve_budget(AUTO_CFG, memory=tight, token_cycle_bytes=cycle, least_bytes=two_layers)
    assert least.bytes == two_layers and least.overruled == "raised to two layers"
    assert "the run may be killed for memory" in (least.warning or "")
    # the room holds the cycle: one cycle is the floor, as before
    roomy = resolve_budget(AUTO_CFG, memory=RUN, token_cycle_bytes=900 * MIB, least_bytes=two_layers)
    assert roomy.bytes == 1197 * MIB and roomy.floor_bytes == 900 * MIB and roomy.warning is None


def test_auto_short_of_a_cycle_on_the_machine_takes_the_cycle_from_its_floor() -> None:
    """Outside a cgroup the floor left to the machine is a reserve for other programs: the
    cycle may take from it, never beyond what is available."""
    machine = RunMemory(MemoryRoom(1500 * MIB, 24 * GIB))  # 1,536 MiB left to the machine
    cycle = resolve_budget(AUTO_CFG, memory=machine, token_cycle_bytes=600 * MIB, least_bytes=2 * MIB)
    assert cycle.bytes == 600 * MIB and cycle.overruled == "raised to one token cycle"
    assert "the run may be killed for memory" in (cycle.warning or "")
    most = resolve_budget(AUTO_CFG, memory=machine, token_cycle_bytes=2000 * MIB, least_bytes=2 * MIB)
    assert most.bytes == 1500 * MIB and most.floor_bytes == 2 * MIB


AUTO_CFG = StreamConfig(enabled=True)
