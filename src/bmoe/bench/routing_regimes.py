"""Routing regimes to judge the expert cache's eviction rules on: decode routing traces
``[tokens, moe_layers, k]`` of expert ids, deterministic (a seeded generator, or a file).

- ``recorded``: a trace recorded from a model (``bmoe.bench.route_capture``); the random
  16-layer bench model's is kept in ``tests/data/bench16_routing.npz``.
- ``published_lru``: recency only, drawn so that an LRU cache over all layers hits as the
  published Qwen3-235B-A22B curve says (``PUBLISHED_QWEN3``; docs/benchmarks.md,
  ../shared/design/references.md, "Real routing"): each layer keeps its experts in a recency
  stack, and each of a token's ``k`` picks takes the expert at a stack depth drawn from
  ``QWEN3_DEPTHS`` (depth < ``share x n_expert`` is, roughly, a hit at that share: every
  layer's stack moves at the same pace, so a cache of that share of every layer holds that
  depth of each); the picks go to the top of the stack after the token.
- ``shifting``: ``zipf`` for the first half, ``published_lru`` for the second: a rule
  fixed in advance is wrong for one half.
- ``zipf``: frequency skew and no recency: per layer, a random order of the experts with
  Zipf popularity (weight ``1 / rank ** exponent``), each token's ``k`` drawn independently
  of the last (without replacement within the token).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

PUBLISHED_QWEN3: tuple[tuple[float, float], ...] = (
    (0.05, 33.9),
    (0.08, 46.6),
    (0.12, 58.0),
    (0.16, 66.6),
    (0.20, 74.3),
    (0.25, 80.0),
    (0.30, 84.3),
    (0.36, 88.6),
    (0.45, 93.3),
    (0.55, 96.1),
    (1.00, 97.9),
)
"""Qwen3-235B-A22B (94 layers, 128 experts, top-8), decode routing replayed through an LRU
cache: (share of the experts cached, hit %), boyle 0.2.1's ``curves.json`` (at 100%: the
cold misses only)."""

QWEN3_DEPTHS: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (0.05, 0.409),
    (0.08, 0.517),
    (0.12, 0.628),
    (0.16, 0.710),
    (0.20, 0.769),
    (0.25, 0.825),
    (0.30, 0.867),
    (0.36, 0.904),
    (0.45, 0.946),
    (0.55, 0.974),
    (1.00, 1.0),
)
"""The stack depth's distribution for ``published_lru``: (depth as a share of the layer's
experts, probability of a smaller depth), piecewise linear; the published curve's points,
corrected (five rounds of replay and adjust at the defaults) for what the whole-expert
caches (``round(share x 128)``), a token's distinct picks and the first uses (cold misses)
change."""


def published_lru(
    n_tokens: int = 800, n_layer: int = 48, n_expert: int = 128, k: int = 8, seed: int = 0
) -> np.ndarray:
    """A recency-only trace whose LRU hit curve follows ``PUBLISHED_QWEN3`` (within 2 points
    at every share at the defaults: 800 tokens make the cold misses about the published
    2.1%)."""
    rng = np.random.default_rng(seed)
    xs = np.array([x for x, _ in QWEN3_DEPTHS])
    ps = np.array([p for _, p in QWEN3_DEPTHS])
    out = np.empty((n_tokens, n_layer, k), dtype=np.uint16)
    for layer in range(n_layer):
        stack = rng.permutation(n_expert)
        u = rng.random((n_tokens, 4 * k))
        depths = np.minimum((np.interp(u, ps, xs) * n_expert).astype(np.int64), n_expert - 1)
        for t in range(n_tokens):
            picked: list[int] = []
            for d in depths[t]:
                if d not in picked:
                    picked.append(int(d))
                    if len(picked) == k:
                        break
            while len(picked) < k:  # 4k draws gave fewer than k distinct depths: the nearest free ones
                picked.append(next(d for d in range(n_expert) if d not in picked))
            chosen = stack[picked]
            out[t, layer] = chosen
            rest = np.ones(n_expert, dtype=bool)
            rest[picked] = False
            stack = np.concatenate([chosen, stack[rest]])
    return out


def zipf(
    n_tokens: int = 800,
    n_layer: int = 48,
    n_expert: int = 128,
    k: int = 8,
    exponent: float = 1.0,
    seed: int = 0,
) -> np.ndarray:
    """Independent draws from a per-layer Zipf popularity: skew, no recency."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_expert + 1) ** exponent
    out = np.empty((n_tokens, n_layer, k), dtype=np.uint16)
    for layer in range(n_layer):
        order = rng.permutation(n_expert)
        # k draws without replacement, weighted: the k largest of log(weight) + Gumbel noise
        keys = np.log(weights) + rng.gumbel(size=(n_tokens, n_expert))
        top = np.argsort(-keys, axis=1)[:, :k]
        out[:, layer] = order[top]
    return out


def shifting(n_tokens: int = 800, n_layer: int = 48, seed: int = 0) -> np.ndarray:
    """A change of regime halfway: ``zipf`` (frequency wins), then ``published_lru``
    (recency wins), the same layers and experts (128, top-8)."""
    half = n_tokens // 2
    return np.concatenate(
        [zipf(half, n_layer, seed=seed), published_lru(n_tokens - half, n_layer, seed=seed + 1)]
    )


def recorded(path: Path) -> tuple[np.ndarray, int]:
    """A trace recorded by ``bmoe.bench.route_capture``: ``(experts, n_expert)``."""
    with np.load(path) as data:
        return data["experts"].astype(np.uint16), int(data["n_expert"])


def per_layer_lru_curve(experts: np.ndarray, shares: Sequence[float], n_expert: int) -> list[float]:
    """The hit rates in percent of ``experts`` through an LRU per layer holding
    ``round(share x n_expert)`` experts each (the published curves' cache: boyle's), from
    empty, one per share: an expert hits when fewer distinct experts of its layer were
    routed since its last use than the cache holds; a token's picks then go to the top of
    the layer's recency stack in slot order."""
    n_layer = experts.shape[1]
    depths: list[int] = []  # per access: its depth in the layer's recency stack, n_expert: first use
    for layer in range(n_layer):
        stack: list[int] = []
        for ids in experts[:, layer].tolist():
            depths.extend(stack.index(e) if e in stack else n_expert for e in ids)
            stack = ids + [e for e in stack if e not in ids]
    hist = np.bincount(np.array(depths), minlength=n_expert + 1)
    below = np.concatenate([[0], np.cumsum(hist)])  # below[d]: accesses at a depth < d
    return [float(100.0 * below[round(share * n_expert)] / len(depths)) for share in shares]
