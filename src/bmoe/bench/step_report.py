"""Where a streamed decode step goes, against the resident step of the same run and the disk.

Each streamed round is paired with the resident round of the same index (the rounds are
interleaved, so the two ran minutes apart on the same machine) and split by
``domain.streaming.step_account.StepAccount``: the step, its wait for reads, the cache's
management, its compute and the part of the compute beyond the resident step, and what the
read lanes' CPU took meanwhile, each per token and per MiB read. Beside it the bound the step
is held to: the MiB read a token over the disk's ``O_DIRECT`` speed at the expert read size
and the lanes' depth (the random probe beside the round where ``--probe-mib`` ran one, else
the one at the start, within the throttle where there is one) plus the resident step; ``of
bound`` is the step over that bound. Medians of the rounds.

Pure: the children's figures in, rows and text out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bmoe.bench.configs import BenchConfig
from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.domain.streaming.step_account import StepAccount

RESIDENT = "resident"


@attrs.frozen
class StepRow:
    """One streamed configuration's step, split (medians over its paired rounds, in ms a
    token; ``*_ms_mib`` per MiB read a token); ``rounds``: the rounds paired."""

    key: str
    label: str
    rounds: int
    step_ms: float
    resident_ms: float | None
    compute_ms: float
    waiting_ms: float
    mgmt_ms: float
    over_resident_ms: float | None
    over_resident_ms_mib: float | None
    lane_cpu_ms: float
    lane_cpu_ms_mib: float | None
    landing_ms: float
    system_ms: float
    read_mib: float
    bound_ms: float | None  # read_mib / the disk's speed + the resident step
    of_bound: float | None  # step / bound


def round_account(run: Mapping[str, Any], resident: Mapping[str, Any] | None) -> StepAccount | None:
    """One streamed round's account (None where it has no counters or no rate), with the
    resident round's step where it finished."""
    counters, n = run.get("counters"), int(run.get("measured_tokens", 0))
    tok_s = float(run.get("tok_s") or 0.0)
    if counters is None or n <= 0 or tok_s <= 0:
        return None
    decode = StreamCounters(
        bytes_read=int(counters["bytes_read"]),
        stall_s=float(counters.get("stall_s", 0.0)),
        mgmt_s=float(counters.get("mgmt_s", 0.0)),
        lane_cpu_s=float(counters.get("lane_cpu_s", 0.0)),
        land_s=float(counters.get("land_s", 0.0)),
        system_s=float(run.get("system_s", 0.0)),
    )
    report = StreamReport(StreamCounters(), decode, decode_steps=n, decode_wall_s=n / tok_s)
    resident_tok_s = float(resident.get("tok_s") or 0.0) if resident is not None else 0.0
    return StepAccount.of(report, 1.0 / resident_tok_s if resident_tok_s > 0 else None)


def step_rows(
    configs: Sequence[BenchConfig], runs: Mapping[str, Sequence[Mapping[str, Any]]], disk_mib_s: float
) -> list[StepRow]:
    """A row per streamed configuration that finished a round (``disk_mib_s``: the speed the
    bound divides by where a round has no probe of its own)."""
    residents = [r if "tok_s" in r and not r.get("error") else None for r in runs.get(RESIDENT, [])]
    rows = []
    for config in configs:
        if not config.streams:
            continue
        accounts: list[StepAccount] = []
        bounds: list[float] = []
        for i, run in enumerate(runs.get(config.key, [])):
            if run.get("error"):
                continue
            account = round_account(run, residents[i] if i < len(residents) else None)
            if account is None:
                continue
            accounts.append(account)
            speed = float(run.get("probe_mib_s") or disk_mib_s)
            if account.resident_step_s is not None and speed > 0:
                bounds.append(account.read_mib / speed + account.resident_step_s)
        if accounts:
            rows.append(_row(config, accounts, bounds))
    return rows


def _row(config: BenchConfig, accounts: list[StepAccount], bounds: list[float]) -> StepRow:
    def ms(values: Sequence[float | None]) -> float | None:
        known = [1e3 * v for v in values if v is not None]
        return float(statistics.median(known)) if known else None

    def must(values: Sequence[float]) -> float:
        return float(statistics.median(1e3 * v for v in values))

    with_resident = [a for a in accounts if a.resident_step_s is not None]
    return StepRow(
        key=config.key,
        label=config.label,
        rounds=len(accounts),
        step_ms=must([a.step_s for a in accounts]),
        resident_ms=ms([a.resident_step_s for a in accounts]),
        compute_ms=must([a.compute_s for a in accounts]),
        waiting_ms=must([a.waiting_s for a in accounts]),
        mgmt_ms=must([a.mgmt_s for a in accounts]),
        over_resident_ms=ms([a.over_resident_s for a in accounts]),
        over_resident_ms_mib=ms([a.per_mib(a.over_resident_s) for a in accounts]),
        lane_cpu_ms=must([a.lane_cpu_s for a in accounts]),
        lane_cpu_ms_mib=ms([a.per_mib(a.lane_cpu_s) for a in accounts]),
        landing_ms=must([a.landing_s for a in accounts]),
        system_ms=must([a.system_s for a in accounts]),
        read_mib=float(statistics.median(a.read_mib for a in accounts)),
        bound_ms=ms(bounds) if bounds else None,
        of_bound=(
            float(statistics.median(a.step_s / b for a, b in zip(with_resident, bounds, strict=False)))
            if bounds
            else None
        ),
    )


def markdown(rows: Sequence[StepRow]) -> list[str]:
    """The report's section (no lines where no streamed round finished)."""
    if not rows:
        return []
    head = (
        "| configuration | step ms | resident ms | compute | waiting | mgmt | compute over resident "
        "(ms/MiB) | lanes' CPU (ms/MiB) | landing | system | MiB read/tok | bound ms | of bound |"
    )
    lines = [
        "### Where a streamed step goes",
        "",
        "Each streamed round beside the resident round of the same index, per token, medians of "
        "the rounds. compute = step - waiting for reads - the cache's management; over resident: "
        "the compute beyond the resident step; lanes' CPU: the worker lanes' own CPU time while "
        "reading (user + system), landing: copying or repacking each expert into the cache (any "
        "lane), system: the process's system time; bound = MiB read a token / the disk's speed + "
        "the resident step.",
        "",
        head,
        "| --- |" + " ---: |" * 12,
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.step_ms:.1f} | {_f(r.resident_ms, '.1f')} | {r.compute_ms:.1f} | "
            f"{r.waiting_ms:.1f} | {r.mgmt_ms:.1f} | {_f(r.over_resident_ms, '.1f')} "
            f"({_f(r.over_resident_ms_mib, '.3f')}) | {r.lane_cpu_ms:.1f} ({_f(r.lane_cpu_ms_mib, '.3f')}) | "
            f"{r.landing_ms:.1f} | {r.system_ms:.1f} | {r.read_mib:.1f} | {_f(r.bound_ms, '.1f')} | "
            f"{_f(r.of_bound, '.2f')} |"
        )
    return [*lines, ""]


def _f(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)
