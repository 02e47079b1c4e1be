"""The run's two verdicts: whether bmoe's greedy tokens equal the reference run's
(:class:`TokenCheck`, against the run :func:`token_reference` picks), and whether the bench
model's routing moves (:class:`RoutingCheck`, from the routing probe's cache hit rate).

Pure: argmax sequences and hit rates in, values out.
"""

from __future__ import annotations

import attrs

from bmoe.bench.configs import ROUTING_PROBE_PERCENT

ROUTING_HIT_BAR = 0.80
"""bmoe's cache holding 25% of the experts must hit below this for the routing to count as moving
(a model whose routing barely changes makes any cache look perfect)."""


@attrs.frozen
class TokenCheck:
    """How many greedy choices of ``key`` equal ``reference``'s, position by position."""

    key: str
    reference: str
    same: int
    compared: int
    first_difference: int | None
    ubatches: tuple[int, int] | None = None  # (this, reference): the prompts' batches, where they differ

    @property
    def equal(self) -> bool:
        return self.compared > 0 and self.same == self.compared

    @property
    def required(self) -> bool:
        """Whether the tokens must be equal: both prefilled their prompt in batches of one size
        (a prompt taken in other batches is computed by other kernel splits, which move the KV
        cache's last bits; the gates compare streamed with resident at the same batch)."""
        return self.ubatches is None


def check_tokens(
    argmax: dict[str, list[int]], reference: str, ubatch: dict[str, int] | None = None
) -> list[TokenCheck]:
    """Compare every configuration's argmax sequence with ``reference``'s (same fed tokens);
    ``ubatch``: each configuration's prompt batch, where a prompt was prefilled."""
    ref = argmax[reference]
    ubatch = ubatch or {}
    out = []
    for key, seq in argmax.items():
        if key == reference:
            continue
        n = min(len(seq), len(ref))
        diffs = [i for i in range(n) if seq[i] != ref[i]]
        this_batch, ref_batch = ubatch.get(key), ubatch.get(reference)
        differ = None
        if this_batch is not None and ref_batch is not None and this_batch != ref_batch:
            differ = (this_batch, ref_batch)
        out.append(TokenCheck(key, reference, n - len(diffs), n, diffs[0] if diffs else None, differ))
    return out


def token_reference(argmax: dict[str, list[int]], *, repack: bool = True) -> str | None:
    """The run bmoe's configurations must match: stock with the weights in the same layout
    as bmoe's (repacked: ``stock``; ``--no-repack``: ``stock-norepack``), else bmoe resident
    (itself equal to that stock run, gated); None when neither ran (a repacked layout under
    a memory limit that skips both: the greedy tokens are then not compared)."""
    same_layout = "stock" if repack else "stock-norepack"
    return next((k for k in (same_layout, "resident") if k in argmax), None)


@attrs.frozen
class RoutingCheck:
    """Whether the bench model's routing moves: the cache's hit rate at 25% of the experts."""

    hit_rate: float | None
    moves: bool | None
    expert_percent: float = ROUTING_PROBE_PERCENT  # the probe's budget as it resolved

    def text(self) -> str:
        if self.hit_rate is None:
            share = f"{ROUTING_PROBE_PERCENT:.0f}%"
            return f"routing check: not measured (no finished streaming run at {share} of the experts)"
        verdict = (
            "the routing moves"
            if self.moves
            else "the routing barely moves: cache hit rates and streamed tok/s on this model are optimistic"
        )
        return (
            f"routing check: a cache of {self.expert_percent:.0f}% of the experts hit "
            f"{100 * self.hit_rate:.1f}% (bar: under {100 * ROUTING_HIT_BAR:.0f}%): {verdict}"
        )


def check_routing(hit_rate: float | None, expert_percent: float | None = None) -> RoutingCheck:
    """The verdict on the probe's hit rate (``expert_percent``: its budget's real share of the
    experts, which rounding to whole MiB moves on a tiny model)."""
    moves = None if hit_rate is None else hit_rate < ROUTING_HIT_BAR
    return RoutingCheck(hit_rate, moves, expert_percent or ROUTING_PROBE_PERCENT)
