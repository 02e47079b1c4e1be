"""The prompt batch a streamed session takes from the memory room, and the expert cache
lending that room to a prompt (``bmoe.domain.streaming.prefill_memory``)."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from bmoe.domain.memory_room import CgroupLevel, MemoryRoom
from bmoe.domain.streaming import MIB, Budget, RunMemory, StreamConfig, resolve_budget
from bmoe.domain.streaming.config import STREAMED_PROMPT_BATCH
from bmoe.domain.streaming.prefill_memory import (
    LEND_FROM_TOKENS,
    PREFILL_FREE_MIB,
    PROMPT_BATCH_FLOOR,
    PROMPT_BATCH_STEP,
    Lend,
    PrefillLending,
    PrefillRoom,
    budget_held_to_room,
    choose_prompt_batch,
    decode_compute_bytes,
    lending_floor,
    spare_bytes,
)

# the trained bench model in a 2 GiB group, as measured: 0.583 MiB of compute buffer a token
TRAINED = PrefillRoom(
    room_bytes=1950 * MIB,
    dense_bytes=14 * MIB,
    kv_bytes=32 * MIB,
    layer_bytes=162 * MIB,
    compute_per_token=0.583 * MIB,
)


def test_the_whole_context_where_its_compute_buffer_fits() -> None:
    batch = choose_prompt_batch(1536, TRAINED)
    assert batch.tokens == 1536
    assert 1536 * TRAINED.compute_per_token <= TRAINED.compute_room_bytes()


def test_else_the_largest_multiple_of_the_step_that_fits() -> None:
    batch = choose_prompt_batch(16384, TRAINED)
    room = 1950 - 14 - 32 - 2 * 162 - PREFILL_FREE_MIB  # 1068 MiB for the compute buffer
    assert TRAINED.compute_room_bytes() == room * MIB
    assert batch.tokens == 1792  # 1068 / 0.583 = 1832, down to a multiple of 64
    assert batch.tokens % PROMPT_BATCH_STEP == 0
    assert (batch.tokens + PROMPT_BATCH_STEP) * TRAINED.compute_per_token > TRAINED.compute_room_bytes()


def test_never_below_the_floor_nor_the_sequences_nor_above_the_context() -> None:
    starved = PrefillRoom(
        room_bytes=100 * MIB, dense_bytes=0, kv_bytes=0, layer_bytes=0, compute_per_token=MIB
    )
    assert starved.compute_room_bytes() == 0
    assert choose_prompt_batch(4096, starved).tokens == PROMPT_BATCH_FLOOR
    assert choose_prompt_batch(4096, starved, least=200).tokens == 200
    assert choose_prompt_batch(32, starved).tokens == 32  # a context smaller than the floor
    free = PrefillRoom(room_bytes=1 << 40, dense_bytes=0, kv_bytes=0, layer_bytes=0, compute_per_token=0)
    assert choose_prompt_batch(8192, free).tokens == 8192


@given(
    room=st.integers(0, 64 << 30),
    dense=st.integers(0, 8 << 30),
    kv=st.integers(0, 4 << 30),
    layer=st.integers(0, 2 << 30),
    per_token=st.floats(1024, 8 * MIB),
    n_ctx=st.integers(8, 131072),
)
def test_a_batch_above_the_floor_always_fits_the_room(
    room: int, dense: int, kv: int, layer: int, per_token: float, n_ctx: int
) -> None:
    r = PrefillRoom(room, dense, kv, layer, per_token)
    batch = choose_prompt_batch(n_ctx, r)
    assert 1 <= batch.tokens <= n_ctx
    if batch.tokens > min(n_ctx, PROMPT_BATCH_FLOOR):
        held = dense + kv + batch.layers * layer + PREFILL_FREE_MIB * MIB
        assert batch.tokens * per_token + held <= room
    if batch.layers == 1:  # the batch before sizing, or less, without the next layer's room
        assert batch.tokens <= STREAMED_PROMPT_BATCH


def test_the_mode_line_shows_the_arithmetic() -> None:
    assert choose_prompt_batch(16384, TRAINED).describe() == (
        "prompt batch 1792 (sized from the room: compute buffer 1045 of 1068 MiB at 0.583 MiB a "
        "token, beside dense 14 + KV 32 + two layers' experts 324 + 512 free)"
    )


def test_a_decode_keeps_the_compute_of_a_small_step() -> None:
    assert decode_compute_bytes(MIB, 2048) == LEND_FROM_TOKENS * MIB
    assert decode_compute_bytes(MIB, 16) == 16 * MIB


def test_a_prompt_borrows_the_cache_room_and_the_first_decode_step_gives_it_back() -> None:
    lending = PrefillLending(compute_per_token=MIB, floor_bytes=100 * MIB)
    assert lending.before(1, 900 * MIB) == Lend()  # a decode step: nothing lent
    assert lending.before(LEND_FROM_TOKENS, 900 * MIB) == Lend()  # a small chunk neither
    assert lending.before(500, 900 * MIB) == Lend(budget=400 * MIB)
    assert lending.before(500, 400 * MIB) == Lend()  # the prompt's next chunk: lent already
    assert lending.before(1, 400 * MIB) == Lend(budget=900 * MIB, release=True)
    assert lending.before(1, 900 * MIB) == Lend()
    assert lending.lent_times == 1


def test_the_lent_budget_keeps_the_floor_and_a_budget_set_meanwhile_is_returned_to() -> None:
    lending = PrefillLending(compute_per_token=MIB, floor_bytes=300 * MIB)
    assert lending.before(2000, 900 * MIB) == Lend(budget=300 * MIB)  # not below two layers
    assert lending.lent
    # the user halves the budget while the prompt runs: in force as far as the prompt allows,
    # and the one the prompt gives back to
    assert lending.set_while_lent(450 * MIB) == 300 * MIB
    assert lending.set_while_lent(200 * MIB) == 200 * MIB
    assert lending.before(1, 200 * MIB) == Lend(budget=200 * MIB, release=True)
    assert not lending.lent
    # a budget already below the floor is not raised by lending
    assert lending.before(2000, 200 * MIB) == Lend()
    assert lending.before(1, 200 * MIB) == Lend(budget=200 * MIB, release=True)
    off = PrefillLending(compute_per_token=MIB, floor_bytes=300 * MIB)  # cache off: budget 0
    assert off.before(2000, 0) == Lend()
    assert off.before(1, 0) == Lend(budget=0, release=True)  # the pages still go back


def test_the_floor_is_two_layers_or_a_token_cycle() -> None:
    assert lending_floor(324 * MIB, 162 * MIB, 400 * MIB) == 324 * MIB
    assert lending_floor(324 * MIB, 324 * MIB, 400 * MIB) == 648 * MIB
    # a budget below the cycle (the room held no more) is lent down to the two layers
    assert lending_floor(972 * MIB, 40 * MIB, 600 * MIB) == 80 * MIB


def test_a_budget_that_leaves_the_compute_buffer_room_lends_only_what_it_must() -> None:
    # 2,000 MiB for the cache and the compute buffer together: a 500 MiB buffer beside a
    # 900 MiB budget fits (nothing lent), a 1,500 MiB one takes 400 MiB of the budget
    lending = PrefillLending(compute_per_token=MIB, floor_bytes=100 * MIB, spare_bytes=2000 * MIB)
    assert lending.before(500, 900 * MIB) == Lend()
    assert lending.before(1, 900 * MIB) == Lend(budget=900 * MIB, release=True)  # its pages go back
    assert lending.before(1500, 900 * MIB) == Lend(budget=500 * MIB)
    assert lending.before(1, 500 * MIB) == Lend(budget=900 * MIB, release=True)
    assert lending.before(3000, 900 * MIB) == Lend(budget=100 * MIB)  # the floor holds


def test_the_spare_room_is_the_room_read_after_dense_and_kv_less_the_prefill_free() -> None:
    room = MemoryRoom.of(20 << 30, 24 << 30, [CgroupLevel(2048 * MIB, 100 * MIB)])
    budget = resolve_budget(
        StreamConfig(enabled=True), memory=RunMemory(room, dense_bytes=14 * MIB), token_cycle_bytes=MIB
    )
    assert spare_bytes(budget) == (1948 - PREFILL_FREE_MIB) * MIB  # 1436
    assert spare_bytes(Budget(0, auto=False)) is None


def test_where_the_next_layer_leaves_less_than_512_one_layer_may_leave_the_old_batch() -> None:
    # the bench model at -c 8448, FA off: 1.09 MiB a token, layers of 324 MiB, 2 GiB
    room = PrefillRoom(1994 * MIB, 187 * MIB, 264 * MIB, 324 * MIB, 1.09 * MIB)
    assert room.compute_room_bytes(2) < STREAMED_PROMPT_BATCH * room.compute_per_token
    batch = choose_prompt_batch(8448, room)
    assert (batch.tokens, batch.layers) == (512, 1)
    assert "+ one layer's experts 324 + 512 free" in batch.describe()
    tight = attrs.evolve(room, room_bytes=1700 * MIB)  # not even 512 beside one layer
    assert choose_prompt_batch(8448, tight).tokens == 320  # 379 fit


def test_the_mode_line_says_what_flash_attention_would_allow() -> None:
    batch = attrs.evolve(choose_prompt_batch(16384, TRAINED), with_flash=4096)
    assert batch.describe().endswith("+ 512 free; -fa on would allow 4096)")


def test_a_prompt_gives_back_the_budget_the_room_still_allows() -> None:
    """After a prompt the auto budget returns, held to the room read again: llama.cpp's CPU
    backend keeps its work buffer (the bench model: 175 MiB after a 1,600-token ubatch), which
    the room at start did not show; the budget before the prompt (1,558) would have the cache
    fill into it (measured: killed five decode steps later in 2 GiB)."""
    now = RunMemory(
        MemoryRoom.of(20 * 1024 * MIB, 24 * 1024 * MIB, [CgroupLevel(2048 * MIB, 1435 * MIB)]),
        compute_buffer_bytes=11 * MIB,
        run_margin_bytes=148 * MIB,
    )
    assert budget_held_to_room(1558 * MIB, 842 * MIB, now, floor=324 * MIB) == (842 + 613 - 148 - 11) * MIB
    assert budget_held_to_room(900 * MIB, 842 * MIB, now, floor=324 * MIB) == 900 * MIB  # room enough
    tight = attrs.evolve(now, room=MemoryRoom.of(0, 0, [CgroupLevel(2048 * MIB, 2048 * MIB)]))
    assert budget_held_to_room(1558 * MIB, 100 * MIB, tight, floor=324 * MIB) == 324 * MIB  # the cycle


def test_a_given_batch_beside_an_auto_budget_is_lent_the_cache_s_room_and_says_so() -> None:
    from bmoe.domain.streaming import StreamConfig
    from bmoe.domain.streaming.prefill_memory import PrefillRoom, PromptBatch
    from bmoe.runtime.prompt_sizing import lends_given_batch

    assert lends_given_batch(StreamConfig(enabled=True), 1920)
    assert not lends_given_batch(StreamConfig(enabled=True), 64)  # a decode-sized ubatch keeps its buffer
    assert not lends_given_batch(StreamConfig(enabled=True, cache_mb=512), 1920)  # a budget asked for
    assert not lends_given_batch(
        StreamConfig(enabled=True, size_prompt_batch=True), 1920
    )  # sized: lent already
    assert not lends_given_batch(StreamConfig(enabled=False), 1920)
    room = PrefillRoom(
        room_bytes=2 << 30, dense_bytes=0, kv_bytes=0, layer_bytes=1 << 20, compute_per_token=1 << 20
    )
    assert (
        "(-b; compute buffer 1920 MiB, lent the cache's room)"
        in PromptBatch(1920, room, given=True).describe()
    )
