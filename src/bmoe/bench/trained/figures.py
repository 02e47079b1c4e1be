"""Routing figures from arrays: what expert-prediction policies could gain on a model.

Inputs are plain arrays, whoever computed them (the torch model, the numpy reference):

- ``routed`` ``[n_seq, n_tok, n_layer, k]``: the experts each token used at each layer;
- ``router_inputs`` ``[n_seq, n_tok, n_layer, n_embd]``: what each layer's router saw;
- ``gates`` ``[n_layer, n_expert, n_embd]``: the routers (``ffn_gate_inp``).

The figures:

- **LRU hit rate** of one global cache of ``(layer, expert)`` entries holding a share of all
  of them, fed token by token and layer by layer over every sequence in turn, as a streaming
  engine would see them. The cache is bmoe's own policy
  (:class:`bmoe.domain.streaming.cache_policy.ExpertCachePolicy`) with every entry one byte,
  so its budget is a number of entries. Cold misses count (at most one per entry).
- **stale-gate agreement** at depth ``d``: layer ``L+d``'s router applied to layer ``L``'s
  router input, its top-k against the top-k layer ``L+d`` really used; the fraction of slots
  in both, per predicted layer ``L+d``.
- **previous-token overlap**: the fraction of token ``t``'s slots at a layer that token
  ``t-1`` of the same sequence also used there.
- **balance**: per layer, the entropy of the expert usage counts over ``log(n_expert)``
  (1: every expert used equally), the busiest expert's share over the uniform share, and the
  mean entropy of each token's router distribution over ``log(n_expert)`` (low: confident).

Uniform random routing scores ``k/n_expert`` on agreement and overlap, and a little under the
cache's share on the LRU hit rate: :func:`uniform_chance`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.streaming.cache_policy import ExpertCachePolicy

IDS = npt.NDArray[np.integer]
FLOATS = npt.NDArray[np.floating]

CACHE_SHARES = (0.25, 0.5)


def _check_routed(routed: IDS, n_expert: int) -> None:
    if routed.ndim != 4:
        raise ValueError(f"routed must be [n_seq, n_tok, n_layer, k], got shape {routed.shape}")
    if routed.size and (routed.min() < 0 or routed.max() >= n_expert):
        raise ValueError(f"expert ids must be in [0, {n_expert})")


@attrs.frozen
class PerLayer:
    """One figure: its mean over all its samples, and per layer (``None``: not defined there)."""

    mean: float
    per_layer: tuple[float | None, ...]


@attrs.frozen
class Balance:
    usage_entropy: tuple[float, ...]
    max_load: tuple[float, ...]
    token_entropy: tuple[float, ...]


@attrs.frozen
class Figures:
    lru: dict[str, PerLayer]
    """Keyed by the cache's share of all entries (``"25%"``)."""
    stale_gate: dict[str, PerLayer]
    """Keyed by depth (``"1"``, ``"2"``), per predicted layer."""
    previous_token: PerLayer
    balance: Balance
    n_tokens: int

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def lru_hit_rate(routed: IDS, n_expert: int, share: float) -> PerLayer:
    """Hits over requests of a global LRU cache of ``share`` of all ``(layer, expert)`` entries."""
    _check_routed(routed, n_expert)
    n_layer = routed.shape[2]
    capacity = max(1, round(share * n_layer * n_expert))
    # a token cycle of every expert leaves the protected segment no room: a plain LRU
    policy = ExpertCachePolicy(
        budget_bytes=capacity, entry_bytes=[1] * n_layer, n_expert=n_expert, n_expert_used=n_expert
    )
    hits = np.zeros(n_layer, dtype=np.int64)
    requests = np.zeros(n_layer, dtype=np.int64)
    for seq in routed:
        for token in seq:
            for layer, ids in enumerate(token.tolist()):
                plan = policy.request(layer, ids)
                hits[layer] += len(plan.hits)
                requests[layer] += len(plan.hits) + len(plan.loads)
    total = int(requests.sum())
    per_layer = tuple(float(h / r) if r else None for h, r in zip(hits, requests, strict=True))
    return PerLayer(mean=float(hits.sum() / total) if total else 0.0, per_layer=per_layer)


def _slot_agreement(predicted: IDS, real: IDS) -> FLOATS:
    """Per row, the fraction of ``real``'s slots that ``predicted`` also holds."""
    match = (predicted[..., :, None] == real[..., None, :]).any(axis=-2)
    share: FLOATS = match.mean(axis=-1)
    return share


def top_k(logits: FLOATS, k: int) -> IDS:
    """The ``k`` largest entries' indices along the last axis, largest first."""
    return np.argsort(-logits, axis=-1, kind="stable")[..., :k]


def stale_gate_agreement(router_inputs: FLOATS, gates: FLOATS, routed: IDS, depth: int) -> PerLayer:
    """Layer ``L+depth``'s router on layer ``L``'s input against layer ``L+depth``'s real top-k."""
    n_expert = gates.shape[1]
    _check_routed(routed, n_expert)
    n_layer, k = routed.shape[2], routed.shape[3]
    if router_inputs.shape[:3] != routed.shape[:3] or gates.shape[0] != n_layer:
        raise ValueError("router_inputs, gates and routed disagree on tokens or layers")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, not {depth}")
    per_layer: list[float | None] = [None] * min(depth, n_layer)
    scores = []
    for target in range(depth, n_layer):
        logits = router_inputs[:, :, target - depth].astype(np.float64) @ gates[target].T.astype(np.float64)
        agreement = _slot_agreement(top_k(logits, k), routed[:, :, target])
        per_layer.append(float(agreement.mean()))
        scores.append(agreement)
    mean = float(np.mean(np.stack(scores))) if scores else 0.0
    return PerLayer(mean=mean, per_layer=tuple(per_layer))


def previous_token_overlap(routed: IDS, n_expert: int) -> PerLayer:
    """Fraction of token ``t``'s slots that token ``t-1`` (same sequence, same layer) used."""
    _check_routed(routed, n_expert)
    if routed.shape[1] < 2:
        raise ValueError("previous-token overlap needs sequences of at least 2 tokens")
    agreement = _slot_agreement(routed[:, :-1], routed[:, 1:])  # [n_seq, n_tok - 1, n_layer]
    per_layer = tuple(float(v) for v in agreement.mean(axis=(0, 1)))
    return PerLayer(mean=float(agreement.mean()), per_layer=per_layer)


def _normalised_entropy(p: FLOATS, axis: int = -1) -> FLOATS:
    logs = np.log(np.where(p > 0, p, 1.0))
    entropy: FLOATS = -(p * logs).sum(axis=axis) / np.log(p.shape[axis])
    return entropy


def balance(routed: IDS, router_inputs: FLOATS, gates: FLOATS) -> Balance:
    """Per layer: usage entropy, the busiest expert's load, the mean per-token router entropy."""
    n_expert = gates.shape[1]
    _check_routed(routed, n_expert)
    usage, peak, confidence = [], [], []
    for layer in range(routed.shape[2]):
        counts = np.bincount(routed[:, :, layer].ravel(), minlength=n_expert).astype(np.float64)
        share = counts / counts.sum()
        usage.append(float(_normalised_entropy(share)))
        peak.append(float(share.max() * n_expert))
        logits = router_inputs[:, :, layer].astype(np.float64) @ gates[layer].T.astype(np.float64)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        confidence.append(float(_normalised_entropy(probs).mean()))
    return Balance(usage_entropy=tuple(usage), max_load=tuple(peak), token_entropy=tuple(confidence))


def figures(
    routed: IDS, router_inputs: FLOATS, gates: FLOATS, shares: Sequence[float] = CACHE_SHARES
) -> Figures:
    """Every figure on one model's routing."""
    n_expert = gates.shape[1]
    return Figures(
        lru={f"{share:.0%}": lru_hit_rate(routed, n_expert, share) for share in shares},
        stale_gate={str(d): stale_gate_agreement(router_inputs, gates, routed, d) for d in (1, 2)},
        previous_token=previous_token_overlap(routed, n_expert),
        balance=balance(routed, router_inputs, gates),
        n_tokens=int(routed.shape[0] * routed.shape[1]),
    )


def uniform_routing(n_tokens: int, n_layer: int, n_expert: int, k: int, seed: int = 0) -> IDS:
    """Uniform random routing, ``[1, n_tokens, n_layer, k]``: every token draws ``k`` distinct
    experts per layer, independently of everything else."""
    draws = np.random.default_rng(seed).random((1, n_tokens, n_layer, n_expert))
    ids: IDS = np.argsort(draws, axis=-1)[..., :k]
    return ids


def uniform_chance(
    n_expert: int, k: int, n_layer: int, n_tokens: int = 4096, shares: Sequence[float] = CACHE_SHARES
) -> dict[str, float]:
    """What uniform random routing scores: ``k/n_expert`` stale-gate agreement and
    previous-token overlap; the LRU hit rates simulated on ``n_tokens`` random tokens (a bit
    under the cache's share: when a layer asks, the layers asked since are the most recent,
    so that layer's entries are the oldest)."""
    chance = {"stale_gate": k / n_expert, "previous_token": k / n_expert}
    ids = uniform_routing(n_tokens, n_layer, n_expert, k)
    chance |= {f"lru {share:.0%}": lru_hit_rate(ids, n_expert, share).mean for share in shares}
    return chance
