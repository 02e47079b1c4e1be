"""A streamed decode step split: compute, waiting for reads, the cache's management, and what
the read lanes' CPU took meanwhile, per token and per MiB read; with a resident step measured
in the same run, the compute beyond it."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming import MIB, StreamCounters, StreamReport
from bmoe.domain.streaming.step_account import StepAccount


def report() -> StreamReport:
    decode = StreamCounters(
        bytes_read=1330 * MIB,  # 133 MiB a token over 10 steps
        stall_s=0.9,
        mgmt_s=0.1,
        lane_cpu_s=0.4,
        land_s=0.2,
        system_s=0.3,
    )
    return StreamReport(prefill=StreamCounters(), decode=decode, decode_steps=10, decode_wall_s=2.0)


def test_the_step_splits_into_compute_waiting_and_management() -> None:
    account = StepAccount.of(report())
    assert account.step_s == pytest.approx(0.2)
    assert (account.waiting_s, account.mgmt_s) == (pytest.approx(0.09), pytest.approx(0.01))
    assert account.compute_s == pytest.approx(0.1)
    assert account.lane_cpu_s == pytest.approx(0.04) and account.read_mib == pytest.approx(133.0)
    assert account.over_resident_s is None
    assert account.text() == (
        "lanes' CPU 40.0 ms/token (0.301 ms/MiB read) (landing 20.0, the process's system time 30.0)"
    )


def test_a_resident_step_of_the_same_run_says_what_the_compute_pays_beyond_it() -> None:
    account = StepAccount.of(report(), resident_step_s=0.03)
    assert account.over_resident_s == pytest.approx(0.07)
    assert account.per_mib(account.over_resident_s) == pytest.approx(0.07 / 133.0)
    assert account.text().endswith("; compute 100.0 = resident 30.0 + 70.0 over it (0.526 ms/MiB read)")


def test_nothing_read_has_no_per_mib_figure() -> None:
    idle = StreamReport(StreamCounters(), StreamCounters(), decode_steps=4, decode_wall_s=0.1)
    account = StepAccount.of(idle, resident_step_s=0.025)
    assert account.per_mib(account.lane_cpu_s) is None
    assert "ms/MiB" not in account.text()
