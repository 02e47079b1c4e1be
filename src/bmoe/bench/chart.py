"""The PNG chart: streamed tok/s against the cache budget, stock and the disk ceiling as lines.

Needs matplotlib (``.venv/bin/pip install -e '.[bench]'`` from a checkout); ``draw`` raises
``ChartUnavailable`` without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bmoe.bench.report import Summary


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def draw(summaries: Sequence[Summary], out: Path, *, title: str, bandwidth_mib_s: float) -> Path:
    """Write the chart to ``out`` (PNG) and return it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ChartUnavailable(
            "no chart: matplotlib is missing (.venv/bin/pip install -e '.[bench]' (from a checkout of bmoe))"
        ) from None

    streamed = sorted(  # by budget: auto has none of its own, and is left out
        (s for s in summaries if s.kind == "stream" and s.ok and s.cache_mib is not None),
        key=lambda s: s.cache_mib or 0,
    )
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    if streamed:
        xs = [s.cache_mib or 0 for s in streamed]
        ax.plot(xs, [s.tok_s or 0.0 for s in streamed], "o-", color="tab:blue", label="bmoe streaming")
        ceiling = [(s.cache_mib or 0, s.ceiling_tok_s) for s in streamed if s.ceiling_tok_s]
        if ceiling:
            ax.plot(
                [c[0] for c in ceiling],
                [c[1] for c in ceiling],
                "--",
                color="tab:gray",
                label=f"disk ceiling ({bandwidth_mib_s:,.0f} MiB/s / MiB read per token)",
            )
    styles = {
        "stock": ("tab:red", "-"),
        "stock-norepack": ("tab:orange", "-"),
        "resident": ("tab:green", ":"),
    }
    for s in summaries:
        if s.kind in styles and s.ok and s.tok_s is not None:
            color, line = styles[s.kind]
            ax.axhline(s.tok_s, color=color, linestyle=line, label=f"{s.label}: {s.tok_s:.2f} tok/s")
    ax.set_xlabel("expert cache budget (MiB)")
    ax.set_ylabel("decode tok/s (teacher forced, median of rounds)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
