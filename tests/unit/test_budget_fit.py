"""The budget against the memory room: an explicit budget that cannot fit is said with the
figures and what would fit; ``auto`` counts the dense part and the KV cache once (they are in
the room's reading) and subtracts the compute buffer still to come; the ``mode:`` line shows
that arithmetic."""

from __future__ import annotations

from bmoe.domain.memory_room import CgroupLevel, MemoryRoom
from bmoe.domain.streaming import MIB, RunMemory, StreamConfig, resolve_budget
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
        "--cache-mb 1261 fits (--cache-mb auto leaves 1024 MiB free besides)"
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
    assert first.endswith("expect almost no hits") and second.startswith("cache 50 MiB + dense 0")


def test_auto_counts_the_dense_part_and_the_kv_cache_once() -> None:
    """They are in the room's reading already: only the compute buffer and the floor go."""
    auto = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=MIB)
    assert auto.bytes == 1348 * MIB - round(87.0 * MIB) - 1024 * MIB
    assert auto.bytes < RUN.cache_fits_bytes  # so auto never draws the warning above


def test_the_mode_line_shows_the_room_and_what_was_subtracted() -> None:
    auto = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=MIB)
    assert stream_mode_line(auto, 4, True, 512) == (
        "mode: expert streaming, cache 237 MiB (auto = room 1348 - compute buffer 87.0 - 1024 left "
        "free; the room: under a cgroup limit of 2048 MiB, after dense 212 + KV 384 MiB), 4 lanes, "
        "O_DIRECT, prompt batch 512"
    )
    starved = resolve_budget(StreamConfig(enabled=True), memory=RUN, token_cycle_bytes=300 * MIB)
    assert "; raised to one token cycle; the room:" in stream_mode_line(starved, 4, True, 512)
    capped = resolve_budget(StreamConfig(enabled=True, cache_ceil_mb=100), memory=RUN, token_cycle_bytes=MIB)
    assert "; capped at --cache-ceil-mb 100; the room:" in stream_mode_line(capped, 4, True, 512)
