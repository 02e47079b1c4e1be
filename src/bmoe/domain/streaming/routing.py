"""Decisions on a layer's routing: ranking a prediction, how well it agreed, dropping cold
experts, substituting resident ones.

- ``rank``: the top-k of a score vector (the stale gate's prediction, route-ahead's
  committed selection): highest score first, ties to the lower expert id.
- ``slot_agreement``: how many of the router's selected experts a prediction named.
- ``routing_weights``: the weights the graph gives the selected experts, normalised to sum
  to 1 (``from_logits``: gpt-oss, whose weights are a softmax over the selected logits).
- ``drop_cold`` (``--drop-cold-experts F``): in decode, a selected expert that is *not
  resident* and whose weight is below ``F / k`` is not read; its weight becomes 0 and the
  survivors are renormalised. The top-weighted expert is never dropped.
- ``substitute`` (``--expert-substitute L``, cache-conditional experts, arXiv 2412.00099):
  a selected expert that is not resident is replaced by the best-scoring resident expert not
  already selected whose router score is at least its score minus ``L``. Never the
  top-scoring one. Deterministic given the cache.

The C engine follows these decision for decision (``cext/route_policy.pxd``); tests drive
both with the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def rank(scores: Sequence[float], k: int) -> list[int]:
    """The ``k`` highest-scoring expert ids, best first; ties go to the lower id."""
    if k < 0:
        raise ValueError("k must be >= 0")
    return sorted(range(len(scores)), key=lambda e: (-scores[e], e))[:k]


def slot_agreement(predicted: Sequence[int], actual: Sequence[int]) -> int:
    """How many of ``actual``'s distinct ids ``predicted`` named."""
    named = set(predicted)
    return sum(1 for e in set(actual) if e in named)


def _sum_in_order(values: Sequence[float]) -> float:
    """Left to right in double precision, as the C loops add (``sum`` may compensate)."""
    total = 0.0
    for v in values:
        total += v
    return total


def routing_weights(values: Sequence[float], *, from_logits: bool) -> list[float]:
    """The selected experts' weights, summing to 1.

    ``values``: the router's probabilities at the selected ids (softmax, sigmoid, ...), or
    with ``from_logits`` its logits (the weights are then their softmax). Non-positive
    probabilities summing to 0 share the weight equally.
    """
    if not values:
        return []
    if from_logits:
        top = max(values)
        exps = [math.exp(v - top) for v in values]
        total = _sum_in_order(exps)
        return [x / total for x in exps]
    total = _sum_in_order(values)
    if total <= 0.0:
        return [1.0 / len(values)] * len(values)
    return [v / total for v in values]


def top_slot(values: Sequence[float]) -> int:
    """The slot of the highest value (the first on a tie)."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def drop_cold(weights: Sequence[float], resident: Sequence[bool], fraction: float) -> list[bool]:
    """Which slots to drop: not resident, weight below ``fraction / k``, never the top slot."""
    k = len(weights)
    if k == 0 or fraction <= 0.0:
        return [False] * k
    threshold = fraction / k
    top = top_slot(weights)
    return [i != top and not resident[i] and weights[i] < threshold for i in range(k)]


def substitute(
    ids: Sequence[int], scores: Sequence[float], resident: Sequence[bool], margin: float
) -> list[int]:
    """The selection after substitution (see the module docstring).

    ``scores[e]`` and ``resident[e]`` for every expert ``e``; ``ids`` the selected experts.
    Slots are visited in order; a substitute is taken out of the candidates for later slots.
    """
    out = list(ids)
    if not out or margin < 0.0:
        return out
    top = top_slot([scores[e] for e in out])
    taken = set(out)
    for slot, e in enumerate(out):
        if slot == top or resident[e]:
            continue
        floor = scores[e] - margin
        best = -1
        for cand in range(len(scores)):
            if not resident[cand] or cand in taken or scores[cand] < floor:
                continue
            if best < 0 or scores[cand] > scores[best]:
                best = cand
        if best >= 0:
            out[slot] = best
            taken.add(best)
    return out


def weight_threshold_ids(ranked: Sequence[int], weights: Sequence[float], fraction: float) -> list[int]:
    """Drop-aware reads ahead: the ranked ids worth reading when cold experts are dropped
    (weight at least ``fraction / k``; the top one always). ``fraction`` 0: all of them."""
    if fraction <= 0.0 or not ranked:
        return list(ranked)
    threshold = fraction / len(ranked)
    top = top_slot(weights)
    return [e for i, e in enumerate(ranked) if i == top or weights[i] >= threshold]
