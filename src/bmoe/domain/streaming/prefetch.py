"""Which experts to read ahead: the previous decode token's routing (``--prefetch K``), and
the whole next layer during a prefill that routes to most experts (``prefill_ahead``).

After a decode token's MoE layer L is served, the next ``K`` MoE layers (layers without
routed experts are skipped) are read ahead with the experts the *previous* token routed
there; then L's own routing is remembered for the next token. Prefill (several tokens per
request) neither reads ahead nor is remembered. The C engine follows this decision for
decision (``prefetch_after`` in ``cext/stream/ahead.pxi``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class PreviousTokenPrefetch:
    """``entry_bytes[layer]`` says which layers have routed experts (> 0)."""

    def __init__(self, depth: int, entry_bytes: Sequence[int]) -> None:
        if depth < 0:
            raise ValueError("prefetch depth must be >= 0")
        self.depth = depth
        self._moe = [size > 0 for size in entry_bytes]
        self._last: dict[int, list[int]] = {}

    def after_request(self, layer: int, experts: Iterable[int], n_tokens: int) -> list[tuple[int, list[int]]]:
        """The reads ahead to issue after ``layer`` was served: ``[(layer, experts)]``."""
        if self.depth == 0 or n_tokens != 1:
            return []
        self._last[layer] = list(dict.fromkeys(int(e) for e in experts))
        targets: list[tuple[int, list[int]]] = []
        seen = 0
        for ahead in range(layer + 1, len(self._moe)):
            if seen == self.depth:
                break
            if not self._moe[ahead]:
                continue
            seen += 1
            if self._last.get(ahead):
                targets.append((ahead, self._last[ahead]))
        return targets


def next_moe_layer(layer: int, entry_bytes: Sequence[int]) -> int | None:
    """The first layer after ``layer`` with routed experts, or None."""
    for ahead in range(layer + 1, len(entry_bytes)):
        if entry_bytes[ahead] > 0:
            return ahead
    return None


def prefill_reads_ahead(n_tokens: int, n_routed: int, n_expert: int) -> bool:
    """A prefill batch (more than one token) that routed at least half of a layer's experts
    will route to most of the next layer's too: read that whole layer ahead, in file order,
    while this one computes. A short batch (a decision's suffix) reads only what it routes."""
    return n_tokens > 1 and 2 * n_routed >= n_expert
