"""Replay routing traces through the expert cache under each eviction rule: hit rates, no
timing, deterministic.

    python -m bmoe.bench.replay [--trace FILE.npz ...] [--tokens N] [--reference] [--victims layer]

Each regime (``bmoe.bench.routing_regimes``: a recency-only trace on the published
Qwen3-MoE LRU curve, per-layer Zipf popularity, a shift from the one to the other, the
random 16-layer bench model's recorded routing; and any ``--trace`` recorded with
``bmoe.bench.route_capture``) is replayed as decode (one request per token and MoE layer,
in order) through one cache over all layers, every entry one byte, the budget a share of
all the experts (5, 10, 25 and 50%), under ``lru``, ``slru``, ``lfu`` and ``adaptive``
(``--cache-policy``). Hits count every request from a cold cache (the published curves
count their cold misses too). The C cache core runs the replays (it follows the reference
policy decision for decision: tests/unit/test_cache_core_equals_policy.py);
``--reference`` runs the Python policy itself (slower); ``--victims layer``: a miss evicts its
own layer's entries first (``--cache-victims``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from bmoe.bench import routing_regimes
from bmoe.domain.streaming.cache_policy import Eviction, ExpertCachePolicy
from bmoe.domain.streaming.victims import VICTIMS, Victims

RULES: tuple[Eviction, ...] = ("lru", "slru", "lfu", "adaptive")
SHARES = (0.05, 0.10, 0.25, 0.50)
BENCH16 = Path(__file__).resolve().parents[3] / "tests" / "data" / "bench16_routing.npz"


@attrs.frozen
class Regime:
    name: str
    experts: np.ndarray  # [tokens, moe_layers, k]
    n_expert: int

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])


def reference_hits(
    regime: Regime, budget: int, eviction: Eviction, victims: Victims = "global"
) -> tuple[int, int]:
    """``(hits, requested)`` through the Python policy."""
    n_layer = regime.experts.shape[1]
    policy = ExpertCachePolicy(budget, [1] * n_layer, regime.n_expert, eviction=eviction, victims=victims)
    rows = regime.experts.tolist()
    for token in rows:
        for layer, ids in enumerate(token):
            policy.request(layer, ids)
    c = policy.counters
    return c.hits, c.hits + c.misses


def core_hits(
    regime: Regime, budget: int, eviction: Eviction, victims: Victims = "global"
) -> tuple[int, int]:
    """``(hits, requested)`` through the C cache core (``request_many``)."""
    from bmoe.cext.cache_core import ExpertCacheCore

    n_tokens, n_layer, k = regime.experts.shape
    core = ExpertCacheCore(budget, [1] * n_layer, regime.n_expert, eviction=eviction, victims=victims)
    rows = np.empty((n_tokens, n_layer, k + 1), dtype=np.int32)
    rows[:, :, 0] = np.arange(n_layer)
    rows[:, :, 1:] = regime.experts
    core.request_many(np.ascontiguousarray(rows.reshape(-1, k + 1)))
    c = core.counters()
    return c["hits"], c["hits"] + c["misses"]


Replayer = Callable[[Regime, int, Eviction], tuple[int, int]]


def hit_pct(regime: Regime, share: float, eviction: Eviction, replayer: Replayer = core_hits) -> float:
    """The hit rate in percent of ``regime`` replayed with ``share`` of its experts cached."""
    n_layer = regime.experts.shape[1]
    budget = round(share * n_layer * regime.n_expert)
    hits, requested = replayer(regime, budget, eviction)
    return 100.0 * hits / requested


def regimes(n_tokens: int | None = None, traces: Sequence[Path] = ()) -> list[Regime]:
    """The regimes of the table: the bench model's recorded routing (when its file is here),
    the published-curve trace, Zipf and the shift from one to the other (48 layers, 800
    tokens), then ``traces``; ``n_tokens``: at most that many tokens of each."""
    generated = n_tokens or 800
    out = [
        Regime("published-lru", routing_regimes.published_lru(generated), 128),
        Regime("zipf", routing_regimes.zipf(generated), 128),
        Regime("zipf-then-lru", routing_regimes.shifting(generated), 128),
    ]
    for path in [BENCH16, *traces] if BENCH16.exists() else list(traces):
        experts, n_expert = routing_regimes.recorded(path)
        out.append(Regime(path.stem, experts[:n_tokens], n_expert))
    return out


def table(rows: Sequence[Regime], shares: Sequence[float] = SHARES, replayer: Replayer = core_hits) -> str:
    """A markdown table: per regime and rule, the hit % at each share; then adaptive less
    the best fixed rule."""
    head = "| regime (tokens x layers) | rule | " + " | ".join(f"{100 * s:g}%" for s in shares) + " |"
    lines = [head, "|" + " --- |" * 2 + " ---: |" * len(shares)]
    for regime in rows:
        figures = {rule: [hit_pct(regime, s, rule, replayer) for s in shares] for rule in RULES}
        name = f"{regime.name} ({regime.n_tokens} x {regime.experts.shape[1]})"
        for rule in RULES:
            lines.append(f"| {name} | {rule} | " + " | ".join(f"{h:.1f}" for h in figures[rule]) + " |")
        best = [max(figures[r][i] for r in RULES if r != "adaptive") for i in range(len(shares))]
        gap = [figures["adaptive"][i] - best[i] for i in range(len(shares))]
        lines.append(f"| {name} | adaptive - best fixed | " + " | ".join(f"{g:+.1f}" for g in gap) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bmoe.bench.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, action="append", default=[], help="a route_capture .npz")
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="decode tokens of each regime (default: 800 generated, every recorded one)",
    )
    parser.add_argument("--reference", action="store_true", help="the Python policy (slower)")
    parser.add_argument(
        "--victims", choices=VICTIMS, default="global", help="whose entries a miss evicts (--cache-victims)"
    )
    args = parser.parse_args(argv)
    base = reference_hits if args.reference else core_hits
    victims: Victims = args.victims

    def replayer(regime: Regime, budget: int, eviction: Eviction) -> tuple[int, int]:
        return base(regime, budget, eviction, victims)

    print(table(regimes(args.tokens, args.trace), replayer=replayer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
