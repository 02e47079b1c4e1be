"""When the rankings go to a worker thread: where a CPU is free beside the compute threads,
unless the engine options say otherwise."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming.rank_worker import rank_on_worker


@pytest.mark.parametrize(
    ("setting", "cpus", "threads", "expected"),
    [
        (None, 2, 2, False),  # this VM: no CPU to spare
        (None, 8, 4, True),
        (None, 1, 2, False),
        (True, 2, 2, True),
        (False, 8, 4, False),
    ],
)
def test_the_worker_ranks_where_a_cpu_is_free(
    setting: bool | None, cpus: int, threads: int, expected: bool
) -> None:
    assert rank_on_worker(setting, cpus, threads) is expected
