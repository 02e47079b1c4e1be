"""``--cache-mb auto`` sets llama.cpp's compute buffer aside: the budget rule subtracts it,
the ``mode:`` line says so, and the figure is read from llama.cpp's log line by line,
per thread."""

from __future__ import annotations

import threading

import pytest

from bmoe.adapters.llama.log import _log_callback, capture_compute_buffers, capture_kv_buffers
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.streaming import MIB, RunMemory, StreamConfig, resolve_budget
from bmoe.domain.summary import stream_mode_line

AUTO = StreamConfig(enabled=True)
INFO = 2  # GGML_LOG_LEVEL_INFO


def room(available_bytes: int, compute_buffer_bytes: int = 0) -> RunMemory:
    """A room of ``available_bytes`` (no cgroup, ``MemTotal`` unknown: 1 GiB left to the
    machine), with that compute buffer still to come."""
    return RunMemory(MemoryRoom(available_bytes), compute_buffer_bytes=compute_buffer_bytes)


def test_auto_subtracts_the_compute_buffer_after_the_floor() -> None:
    budget = resolve_budget(AUTO, memory=room(5000 * MIB, 300 * MIB), token_cycle_bytes=10 * MIB)
    assert budget.bytes == (5000 - 1024 - 300) * MIB
    assert budget.auto and budget.compute_buffer_bytes == 300 * MIB
    without = resolve_budget(AUTO, memory=room(5000 * MIB), token_cycle_bytes=10 * MIB)
    assert without.bytes == 3976 * MIB and without.compute_buffer_bytes == 0


def test_the_ceiling_and_the_token_cycle_still_bound_auto() -> None:
    capped = StreamConfig(enabled=True, cache_ceil_mb=2000)
    roomy = resolve_budget(capped, memory=room(5000 * MIB, 300 * MIB), token_cycle_bytes=10 * MIB)
    assert roomy.bytes == 2000 * MIB
    tight = resolve_budget(capped, memory=room(2500 * MIB, 300 * MIB), token_cycle_bytes=10 * MIB)
    assert tight.bytes == (2500 - 1024 - 300) * MIB
    starved = resolve_budget(AUTO, memory=room(1200 * MIB, 300 * MIB), token_cycle_bytes=50 * MIB)
    assert starved.bytes == 50 * MIB and starved.compute_buffer_bytes == 300 * MIB


def test_an_explicit_budget_is_not_reduced() -> None:
    given = resolve_budget(
        StreamConfig(enabled=True, cache_mb=700),
        memory=room(800 * MIB, 300 * MIB),
        token_cycle_bytes=10 * MIB,
    )
    assert (given.bytes, given.auto, given.compute_buffer_bytes) == (700 * MIB, False, 0)


def test_a_negative_compute_buffer_is_a_bug() -> None:
    with pytest.raises(ValueError, match="compute_buffer_bytes must be >= 0"):
        room(0, -1)


def test_the_mode_line_says_what_auto_subtracted() -> None:
    auto = resolve_budget(AUTO, memory=room(4789 * MIB, round(88.51 * MIB)), token_cycle_bytes=MIB)
    assert stream_mode_line(auto, 4, True, 512) == (
        "mode: expert streaming, cache 3676 MiB (auto = room 4789 - compute buffer 88.5 - 1024 MiB left "
        "to the machine; the room: MemAvailable, after dense 0 + KV 0 MiB), 4 lanes, O_DIRECT, "
        "prompt batch 512"
    )
    given = resolve_budget(
        StreamConfig(enabled=True, cache_mb=700), memory=room(4788 * MIB), token_cycle_bytes=MIB
    )
    assert "(set)" in stream_mode_line(given, 4, True, 512)


def log(text: bytes, level: int = INFO) -> None:
    _log_callback(level, text, None)


def test_the_compute_buffer_lines_of_the_log_are_captured_per_backend_in_bytes() -> None:
    with capture_compute_buffers() as found:
        log(b"sched_reserve: reserving ...\n")
        log(b"sched_reserve:        CPU compute buffer size =    88.51 MiB\n")
        log(b"sched_reserve:  CUDA_Host compute buffer size =     2 MiB\n")
        log(b"sched_reserve:        CPU compute buffer size =    90.00 MiB\n")  # reserved again
        log(b"llama_context:        CPU  output buffer size =     0.58 MiB\n")
    assert found == {"CPU": 90 * MIB, "CUDA_Host": 2 * MIB}
    log(b"sched_reserve:        CPU compute buffer size =     1.00 MiB\n")  # after: not captured
    assert found == {"CPU": 90 * MIB, "CUDA_Host": 2 * MIB}


def test_another_threads_log_lines_do_not_mix_in() -> None:
    def other() -> None:
        log(b"sched_reserve:        CPU compute buffer size =   500.00 MiB\n")

    with capture_compute_buffers() as found:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        log(b"sched_reserve:        CPU compute buffer size =     0.25 MiB\n")
    assert found == {"CPU": MIB // 4}


def test_the_kv_cache_lines_add_up_per_backend() -> None:
    """A model with sliding-window layers has two KV caches: each logs its buffer."""
    with capture_kv_buffers() as found:
        log(b"llama_kv_cache:        CPU KV buffer size =   128.00 MiB\n")
        log(b"llama_kv_cache:        CPU KV buffer size =    16.00 MiB\n")
        log(b"sched_reserve:        CPU compute buffer size =    88.51 MiB\n")
    assert found == {"CPU": 144 * MIB}
