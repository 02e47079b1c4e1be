"""What a verify batch reads, in tokens' worth of plain steps: the price a draft must beat.

A decode step of one token reads the ``k`` experts it routes to at each MoE layer; a batch
of ``n`` rows reads the union of its rows' experts once. Under uniform, independent routing
over ``E`` experts a layer, the expected union is ``E * (1 - (1 - k / E) ** n)`` experts, so
a batch of ``n`` rows costs ``(E / k) * (1 - (1 - k / E) ** n)`` one-token steps: about ``n``
for small batches, at most ``E / k`` (every expert of the layer) for large ones. The trained
bench model (64 experts, top-8) measured 1.83, 3.13, 5.07, 6.34 and 7.24 for 2, 4, 9, 17 and
33 rows (cache off: docs/benchmarks.md, "Copy drafts"), where this says 1.88, 3.31, 5.59,
7.17 and 7.90: the real routing overlaps a little more than uniform routing, so the price is
a little high, never low. A model with no routed experts reads the same weights for any
batch: a price of 1.

A verify of a draft of ``d`` tokens of which ``a`` are accepted emits ``a + 1`` tokens for
the price of ``d + 1`` rows: it paid where ``a + 1`` is at least that price. Pure: counts in.
"""

from __future__ import annotations


def batch_price(rows: int, n_expert: int, n_used: int) -> float:
    """One-token steps' worth of expert reads of a batch of ``rows`` (uniform routing)."""
    if rows <= 0:
        return 0.0
    if n_expert <= 0 or n_used <= 0 or n_used >= n_expert:
        return 1.0  # no routed experts: the same weights for any batch
    share = n_used / n_expert
    return (1.0 - (1.0 - share) ** rows) / share
