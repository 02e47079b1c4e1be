"""The PNG of a ``bmoe_metrics v2`` run: per decode token, tok/s, MiB read and hit rate, and
the time split (compute, cache management, waiting for reads) stacked.

Needs matplotlib (``.venv/bin/pip install -e '.[bench]'`` from a checkout); ``draw`` raises
``ChartUnavailable`` without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bmoe.domain.metrics import MetricsFile


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ChartUnavailable(
            "no chart: matplotlib is missing (.venv/bin/pip install -e '.[bench]' (from a checkout of bmoe))"
        ) from None
    return plt


def _series(m: MetricsFile, name: str, rows: list[dict[str, float]]) -> list[float] | None:
    """A column over the decode rows, -1 (not measured) as NaN; None when absent or all -1."""
    if name not in m.columns:
        return None
    values = [r[name] if r[name] >= 0 else float("nan") for r in rows]
    return values if any(v == v for v in values) else None


def draw(m: MetricsFile, out: Path, title: str) -> None:
    """Write the chart to ``out`` (decode tokens only: the first comes from the prefill)."""
    plt = _pyplot()
    rows = [r for r in m.rows if r["step"] > 1] or list(m.rows)
    steps = [int(r["step"]) for r in rows]
    tok_s = [1000.0 / r["wall_ms"] if r["wall_ms"] > 0 else float("nan") for r in rows]
    read = _series(m, "read_bytes", rows)
    hit = _series(m, "cache_hit_pct", rows)
    compute = _series(m, "compute_ms", rows)
    panels = 2 + (read is not None) + (hit is not None)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 2.2 * panels + 0.6), sharex=True, squeeze=False)
    ax = [a[0] for a in axes]
    ax[0].plot(steps, tok_s, color="tab:blue", marker=".")
    ax[0].set_ylabel("tok/s")
    i = 1
    if read is not None:
        ax[i].bar(steps, [v / 1048576 for v in read], color="tab:orange")
        ax[i].set_ylabel("MiB read")
        i += 1
    if hit is not None:
        ax[i].plot(steps, hit, color="tab:green", marker=".")
        ax[i].set_ylabel("hit %")
        ax[i].set_ylim(-2, 102)
        i += 1
    last = ax[i]
    if compute is not None:
        stall = _series(m, "stall_ms", rows) or [0.0] * len(rows)
        mgmt = _series(m, "mgmt_ms", rows) or [0.0] * len(rows)
        last.bar(steps, compute, label="compute", color="tab:blue")
        last.bar(steps, mgmt, bottom=compute, label="cache mgmt", color="tab:gray")
        below = [c + g for c, g in zip(compute, mgmt, strict=True)]
        last.bar(steps, stall, bottom=below, label="waiting for reads", color="tab:red")
        tops = [b + t for b, t in zip(below, stall, strict=True) if b + t == b + t]
        last.set_ylim(0, 1.35 * max(tops, default=1.0))
        last.legend(loc="upper right", fontsize="small", ncol=3)
    else:
        last.bar(steps, [r["wall_ms"] for r in rows], label="wall", color="tab:blue")
    last.set_ylabel("ms per token")
    last.set_xlabel("token")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
