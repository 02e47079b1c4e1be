"""The figures as small Markdown tables: trained against untrained against chance, then the
trained model per layer."""

from __future__ import annotations

from collections.abc import Mapping

from bmoe.bench.trained.figures import Figures


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def summary_table(models: Mapping[str, Figures], chance: Mapping[str, float]) -> str:
    """One row per figure (means over layers and tokens), one column per model, then chance."""
    names = list(models)
    first = next(iter(models.values()))
    rows: list[tuple[str, list[str], str]] = []
    for share in first.lru:
        rows.append(
            (
                f"LRU hit rate, global cache of {share} of entries",
                [_pct(models[m].lru[share].mean) for m in names],
                _pct(chance[f"lru {share}"]),
            )
        )
    for depth in first.stale_gate:
        rows.append(
            (
                f"stale-gate slot agreement, depth {depth}",
                [_pct(models[m].stale_gate[depth].mean) for m in names],
                _pct(chance["stale_gate"]),
            )
        )
    rows.append(
        (
            "previous-token slot overlap",
            [_pct(models[m].previous_token.mean) for m in names],
            _pct(chance["previous_token"]),
        )
    )
    rows.append(
        (
            "expert-usage entropy / log(n_expert), mean",
            [f"{_mean(models[m].balance.usage_entropy):.3f}" for m in names],
            "1.000",
        )
    )
    rows.append(
        (
            "busiest expert's load / uniform, max over layers",
            [f"{max(models[m].balance.max_load):.2f}" for m in names],
            "1.00",
        )
    )
    rows.append(
        (
            "per-token router entropy / log(n_expert), mean",
            [f"{_mean(models[m].balance.token_entropy):.3f}" for m in names],
            "-",
        )
    )
    header = "| figure | " + " | ".join(names) + " | uniform random routing |"
    rule = "| --- |" + " ---: |" * (len(names) + 1)
    body = [f"| {label} | " + " | ".join(values) + f" | {ref} |" for label, values, ref in rows]
    return "\n".join([header, rule, *body])


def layer_table(f: Figures) -> str:
    """The per-layer figures of one model (stale-gate columns: the layer predicted)."""
    shares = list(f.lru)
    depths = list(f.stale_gate)
    header = (
        "| layer | "
        + " | ".join(f"LRU {s}" for s in shares)
        + " | "
        + " | ".join(f"stale-gate d{d}" for d in depths)
        + " | prev-token | usage entropy | max load | token entropy |"
    )
    rule = "| ---: |" + " ---: |" * (len(shares) + len(depths) + 4)
    body = []
    for il in range(len(f.previous_token.per_layer)):
        cells = [_pct(f.lru[s].per_layer[il]) for s in shares]
        cells += [_pct(f.stale_gate[d].per_layer[il]) for d in depths]
        cells.append(_pct(f.previous_token.per_layer[il]))
        b = f.balance
        cells += [f"{b.usage_entropy[il]:.3f}", f"{b.max_load[il]:.2f}", f"{b.token_entropy[il]:.3f}"]
        body.append(f"| {il} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *body])


def _mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values)
