"""``--cache-mb auto`` sets llama.cpp's compute buffer aside: the budget rule subtracts it,
the ``mode:`` line says so, and the figure is read from llama.cpp's log line by line,
per thread."""

from __future__ import annotations

import threading

import pytest

from bmoe.adapters.llama.log import _log_callback, capture_compute_buffers
from bmoe.domain.streaming import MIB, StreamConfig, resolve_budget
from bmoe.domain.summary import stream_mode_line

AUTO = StreamConfig(enabled=True)
INFO = 2  # GGML_LOG_LEVEL_INFO


def test_auto_subtracts_the_compute_buffer_after_the_floor() -> None:
    budget = resolve_budget(
        AUTO, available_bytes=5000 * MIB, token_cycle_bytes=10 * MIB, compute_buffer_bytes=300 * MIB
    )
    assert budget.bytes == (5000 - 1024 - 300) * MIB
    assert budget.auto and budget.compute_buffer_bytes == 300 * MIB
    without = resolve_budget(AUTO, available_bytes=5000 * MIB, token_cycle_bytes=10 * MIB)
    assert without.bytes == 3976 * MIB and without.compute_buffer_bytes == 0


def test_the_ceiling_and_the_token_cycle_still_bound_auto() -> None:
    capped = StreamConfig(enabled=True, cache_ceil_mb=2000)
    roomy = resolve_budget(
        capped, available_bytes=5000 * MIB, token_cycle_bytes=10 * MIB, compute_buffer_bytes=300 * MIB
    )
    assert roomy.bytes == 2000 * MIB
    tight = resolve_budget(
        capped, available_bytes=2500 * MIB, token_cycle_bytes=10 * MIB, compute_buffer_bytes=300 * MIB
    )
    assert tight.bytes == (2500 - 1024 - 300) * MIB
    starved = resolve_budget(
        AUTO, available_bytes=1200 * MIB, token_cycle_bytes=50 * MIB, compute_buffer_bytes=300 * MIB
    )
    assert starved.bytes == 50 * MIB and starved.compute_buffer_bytes == 300 * MIB


def test_an_explicit_budget_is_not_reduced() -> None:
    given = resolve_budget(
        StreamConfig(enabled=True, cache_mb=700),
        available_bytes=800 * MIB,
        token_cycle_bytes=10 * MIB,
        compute_buffer_bytes=300 * MIB,
    )
    assert (given.bytes, given.auto, given.compute_buffer_bytes) == (700 * MIB, False, 0)


def test_a_negative_compute_buffer_is_a_bug() -> None:
    with pytest.raises(ValueError, match="compute_buffer_bytes must be >= 0"):
        resolve_budget(AUTO, available_bytes=0, token_cycle_bytes=0, compute_buffer_bytes=-1)


def test_the_mode_line_says_what_auto_subtracted() -> None:
    auto = stream_mode_line(3676.0, True, 4, True, 512, compute_buffer_mib=88.51)
    assert auto == (
        "mode: expert streaming, cache 3676 MiB (auto, compute buffer 88.5 MiB subtracted), 4 lanes, "
        "O_DIRECT, prompt batch 512"
    )
    assert "(set)" in stream_mode_line(700.0, False, 4, True, 512)


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
