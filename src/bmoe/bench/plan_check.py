"""``python -m bmoe.bench --plan``: the planner's prediction (``bmoe.runtime.planning``,
``python -m bmoe.plan``) printed beside each streamed configuration's measured figures, so
every bench run checks the planner: decode tok/s (and which bound it predicted), MiB read a
token, prefill time. The plan is made for the bench's memory limit, context and budget, and
the disk as the bench found it (the configuration's random-read probe where one ran, else
the throttle or the sequential read)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bmoe.bench import configs as cf
from bmoe.bench.disk import MIB
from bmoe.domain.plan.predict import PlanSettings
from bmoe.runtime.planning import MachineOptions, plan_local


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _measured(runs: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    ok = [r for r in runs if "error" not in r]
    per_token = [
        r["counters"]["bytes_read"] / MIB / r["measured_tokens"]
        for r in ok
        if r.get("measured_tokens")
        and isinstance(r.get("counters"), Mapping)
        and "bytes_read" in r["counters"]
    ]
    return {
        "tok_s": _mean([r["tok_s"] for r in ok if "tok_s" in r]),
        "mib_token": _mean(per_token),
        "prefill_s": _mean([r["prefill_s"] for r in ok if r.get("prefill_s")]),
        "disk_mib_s": _mean([r["probe_mib_s"] for r in ok if r.get("probe_mib_s")]),
    }


def _vs(predicted: float, measured: float | None, fmt: str) -> str:
    if measured is None or measured <= 0:
        return f"predicted {predicted:{fmt}}, not measured"
    return f"predicted {predicted:{fmt}}, measured {measured:{fmt}} ({predicted / measured - 1:+.0%})"


def prediction_lines(
    model: Path,
    configs: Sequence[cf.BenchConfig],
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    n_ctx: Mapping[str, int],
    prompt_tokens: int,
    mem_limit_mb: int | None,
    disk_mib_s: float,
) -> list[str]:
    """One line per streamed configuration that ran: the prediction beside the measure."""
    out = []
    for config in configs:
        measured = _measured(runs.get(config.key, ()))
        if config.kind != "stream" or measured["tok_s"] is None or config.parallel is not None:
            continue
        settings = PlanSettings(
            n_ctx=n_ctx[config.key],
            cache_mb=config.cache_mib,
            prompt_tokens=(prompt_tokens,) if prompt_tokens else (),
        )
        disk = measured["disk_mib_s"] or disk_mib_s
        plan = plan_local(
            model, settings, MachineOptions(mem_limit_mb=mem_limit_mb or None, disk_mib_s=disk)
        ).plan
        parts = [
            f"decode tok/s {_vs(plan.decode_tok_s, measured['tok_s'], '.2f')} "
            f"({plan.decode_bound}-bound predicted)",
            f"MiB/token {_vs(plan.read_bytes_per_token / MIB, measured['mib_token'], '.1f')}",
        ]
        if plan.prefills:
            p = plan.prefills[0]
            parts.append(
                f"prefill {p.tokens} tokens s {_vs(p.seconds, measured['prefill_s'], '.1f')} "
                f"({p.bound}-bound)"
            )
        out.append(f"bench: plan: {config.label}: " + "; ".join(parts) + f" (disk {disk:.0f} MiB/s)")
    return out
