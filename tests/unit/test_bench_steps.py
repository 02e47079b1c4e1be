"""The bench's step account: each streamed round beside the resident round of the same index,
split into compute, waiting and management, the compute beyond the resident step and the
lanes' CPU per MiB read, against the bound (MiB read over the disk + the resident step); and
the ``auto`` budget as a configuration of its own."""

from __future__ import annotations

import pytest

from bmoe.bench import configs as cf
from bmoe.bench.report import summarize
from bmoe.bench.step_report import markdown, step_rows

MIB = 1 << 20


def streamed(tok_s: float, read_mib: float, stall_s: float, n: int = 10, **extra: float) -> dict[str, object]:
    counters = {
        "bytes_read": int(read_mib * n * MIB),
        "stall_s": stall_s,
        "mgmt_s": 0.05,
        "hits": 1,
        "misses": 1,
    }
    return {
        "tok_s": tok_s,
        "step_ms_median": 1e3 / tok_s,
        "measured_tokens": n,
        "counters": counters | extra,
        "system_s": 0.2,
    }


def test_each_streamed_round_is_paired_with_the_resident_round_beside_it() -> None:
    configs = cf.build_configs(["resident", "stream"], [cf.Budget(mib=1536)], expert_bytes=4096 * MIB)
    runs = {
        "resident": [{"tok_s": 40.0}, {"tok_s": 20.0}],
        "stream-1536": [
            streamed(5.0, 100.0, stall_s=0.5, lane_cpu_s=0.3, land_s=0.1),  # step 200, waiting 50
            streamed(4.0, 100.0, stall_s=0.5, lane_cpu_s=0.3, land_s=0.1),  # step 250
        ],
        "stream-1024": [{"error": "killed"}, streamed(5.0, 120.0, stall_s=1.0)],
    }
    rows = {r.key: r for r in step_rows(configs, runs, disk_mib_s=1000.0)}
    row = rows["stream-1536"]
    assert row.rounds == 2 and row.step_ms == pytest.approx(225.0)
    assert row.resident_ms == pytest.approx(37.5)  # 25 and 50, paired by round
    assert row.compute_ms == pytest.approx(170.0) and row.waiting_ms == pytest.approx(50.0)  # 145, 195
    assert row.over_resident_ms == pytest.approx(132.5)  # 120 and 145
    assert row.lane_cpu_ms_mib == pytest.approx(0.3)  # 30 ms a token for 100 MiB
    assert row.bound_ms == pytest.approx(137.5)  # 100 MiB at 1000 MiB/s + 25 or 50
    assert row.of_bound == pytest.approx((200 / 125 + 250 / 150) / 2)
    assert rows["stream-1024"].rounds == 1  # the failed round has no account
    text = "\n".join(markdown(list(rows.values())))
    assert "### Where a streamed step goes" in text and "| 225.0 | 37.5 |" in text


def test_a_round_without_a_resident_beside_it_has_no_bound() -> None:
    configs = cf.build_configs(["stream"], [cf.Budget(mib=64)], expert_bytes=128 * MIB)
    rows = step_rows(configs, {"stream-64": [streamed(10.0, 5.0, stall_s=0.1)]}, disk_mib_s=500.0)
    assert rows[0].resident_ms is None and rows[0].bound_ms is None and rows[0].of_bound is None
    assert markdown([]) == []


def test_auto_is_a_budget_the_session_chooses_and_the_report_says_which() -> None:
    budgets = cf.parse_budgets("auto,1536")
    assert budgets[0] == cf.Budget(auto=True)
    configs = cf.build_configs(["resident", "stream"], budgets, expert_bytes=4096 * MIB)
    auto = next(c for c in configs if c.key == "stream-auto")
    assert auto.cache_mib is None and auto.streams
    with pytest.raises(cf.BenchConfigError, match="chosen by the session"):
        budgets[0].resolve_mib(4096 * MIB)
    with pytest.raises(cf.BenchConfigError):
        cf.Budget(mib=5, auto=True)
    run = streamed(5.0, 100.0, 0.1) | {"stream_info": {"budget_bytes": 1661 * MIB}}
    assert summarize(auto, [run, run]).notes[0] == "auto budget 1,661, 1,661 MiB (by round)"
