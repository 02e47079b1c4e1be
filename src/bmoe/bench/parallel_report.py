"""``--parallel``: the bench's figures for several sequences per decode step.

Each sequence count is concluded as a run of its own (:func:`report.conclude` on the
configurations at that count): x stock divides by stock at the same count, and the greedy
tokens are compared with stock's at the same count, where llama.cpp's kernels see the same
batch shapes, so they must be equal. Across counts, the table puts each configuration's
aggregate tok/s beside its own at one sequence, and the MiB it read per generated token: the
union's saving, when several sequences route to the same experts in one step.

Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import attrs

from bmoe.bench import report
from bmoe.bench.checks import RoutingCheck, TokenCheck
from bmoe.bench.configs import BenchConfig


def counts(configs: Sequence[BenchConfig]) -> list[int]:
    return sorted({c.parallel for c in configs if c.parallel is not None})


def conclude(
    configs: Sequence[BenchConfig],
    runs: dict[str, list[dict[str, Any]]],
    expert_bytes: int,
    bandwidth_mib_s: float,
    skipped: dict[str, str] | None = None,
    *,
    repack: bool = True,
) -> report.Outcome:
    """One :class:`report.Outcome` for all counts: each count concluded on its own under the
    plain keys (so its ratios and checks find ``stock`` and ``resident``), then put back under
    the configurations' own keys. The routing check and the prefill ratio's baseline (named by
    its plain key, as at every count) are the smallest count's."""
    skipped = skipped or {}
    summaries: list[report.Summary] = []
    checks: list[TokenCheck] = []
    routing: RoutingCheck | None = None
    baseline = report.StockBaseline(None)
    for n in counts(configs):
        group = [c for c in configs if c.parallel == n]
        full = {c.plain_key: c.key for c in group}
        outcome = report.conclude(
            [attrs.evolve(c, key=c.plain_key) for c in group],
            {c.plain_key: runs.get(c.key, []) for c in group},
            expert_bytes,
            bandwidth_mib_s,
            {c.plain_key: skipped[c.key] for c in group if c.key in skipped},
            repack=repack,
        )
        summaries += [attrs.evolve(s, key=full[s.key]) for s in outcome.summaries]
        checks += [attrs.evolve(t, key=full[t.key], reference=full[t.reference]) for t in outcome.checks]
        if routing is None:
            routing, baseline = outcome.routing, outcome.baseline
    assert routing is not None, "no configuration has a sequence count"
    return report.Outcome(summaries, checks, routing, baseline)


@attrs.frozen
class Row:
    """One configuration at one count, beside itself at one sequence."""

    label: str
    sequences: int
    tok_s: float | None  # aggregate: every sequence's tokens / wall time (median of the rounds)
    seq_tok_s: float | None  # one sequence's
    step_ms: float | None
    x_one: float | None  # tok_s over the same configuration's at one sequence
    x_stock: float | None  # over stock's at the same count
    mib_per_tok: float | None  # read per generated token (streaming)
    mib_per_tok_x_one: float | None  # that over the same configuration's at one sequence
    hit_rate: float | None
    error: str | None = None


def rows(
    configs: Sequence[BenchConfig], outcome: report.Outcome, runs: dict[str, list[dict[str, Any]]]
) -> list[Row]:
    by_key = {s.key: s for s in outcome.summaries}
    one = {c.plain_key: by_key.get(c.key) for c in configs if c.parallel == 1}
    out = []
    for c in configs:
        s = by_key.get(c.key)
        if s is None or c.parallel is None:
            continue
        alone = one.get(c.plain_key)
        seq_rates = [
            float(r["seq_tok_s"]) for r in runs.get(c.key, []) if r.get("seq_tok_s") and not r.get("error")
        ]
        error = s.skipped and f"skipped: {s.skipped}"
        if error is None and not s.ok:
            error = f"failed: {'; '.join(dict.fromkeys(s.errors))}"
        out.append(
            Row(
                label=c.plain_key,
                sequences=c.parallel,
                tok_s=s.tok_s,
                seq_tok_s=float(statistics.median(seq_rates)) if seq_rates else None,
                step_ms=s.step_ms,
                x_one=_over(s.tok_s, alone.tok_s if alone else None),
                x_stock=s.x_stock,
                mib_per_tok=s.mib_per_tok,
                mib_per_tok_x_one=_over(s.mib_per_tok, alone.mib_per_tok if alone else None),
                hit_rate=s.hit_rate,
                error=error,
            )
        )
    return out


def _over(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _f(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def markdown_table(table: Sequence[Row]) -> str:
    head = [
        "configuration",
        "sequences",
        "aggregate tok/s",
        "per sequence tok/s",
        "median step ms",
        "x 1 sequence",
        "x stock (same sequences)",
        "MiB read per generated token",
        "MiB/token x 1 sequence",
        "hit %",
    ]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in table:
        if r.error is not None:
            cells = [r.label, str(r.sequences), r.error] + [""] * (len(head) - 3)
        else:
            cells = [
                r.label,
                str(r.sequences),
                _f(r.tok_s, ".2f"),
                _f(r.seq_tok_s, ".2f"),
                _f(r.step_ms, ".1f"),
                _f(r.x_one, ".2f"),
                _f(r.x_stock, ".2f"),
                _f(r.mib_per_tok, ".2f"),
                _f(r.mib_per_tok_x_one, ".2f"),
                _f(None if r.hit_rate is None else 100 * r.hit_rate, ".1f"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


LEGEND = (
    "Sequences: texts decoded together, one token of each per `llama_decode` (sequence s is fed "
    "the built-in text from its s-th of evenly spread starts, the same at every count; its prompt "
    "prefilled on its own first), in one KV cache of n_ctx = sequences x fed tokens "
    "(`kv_unified`, llama-server's default with -np auto). Aggregate tok/s: every sequence's "
    "measured tokens / the measured steps' wall time, median of the rounds; per sequence: steps / "
    "wall time. x stock: aggregate over stock llama-cpp-python's at the same count. MiB read per "
    "generated token: the streamer's reads over every sequence's measured tokens; x 1 sequence: "
    "over the same configuration's at one sequence (below 1: experts read once for several "
    "sequences)."
)


def seq0_lines(configs: Sequence[BenchConfig], runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Sequence 0 is fed the same text at every count: how many of its greedy tokens at N
    sequences equal the same configuration's alone (llama.cpp's batched kernels may round
    differently by batch shape, so this is reported, not required)."""
    first = {
        c.key: next((r["seq_argmax"][0] for r in runs.get(c.key, []) if r.get("seq_argmax")), None)
        for c in configs
    }
    alone = {c.plain_key: first[c.key] for c in configs if c.parallel == 1}
    out = []
    for c in configs:
        mine, ref = first.get(c.key), alone.get(c.plain_key)
        if c.parallel in (None, 1) or mine is None or ref is None:
            continue
        n = min(len(mine), len(ref))
        same = sum(a == b for a, b in zip(mine[:n], ref[:n], strict=True))
        out.append(
            f"- {c.label}: sequence 0 chose {same} of {n} greedy tokens as {c.plain_key} alone "
            "(batch shapes differ: not required equal)"
        )
    return out
