"""Whether a decision keeps the state after its prefix (``--decide-prefix-cache auto``), from
what each prefill piece costs.

Keeping the state after the prefix means prefilling the prompt in two pieces: the prefix's
new tokens (then the state is copied), then the rest. Resident, two pieces cost what one
does, and the kept state saves the next decision that shares the prefix all of those tokens'
compute: keep it. Streamed, each piece reads the experts it routes that the cache lacks; a
piece of a few dozen tokens routes nearly every expert of a 128-expert model, so the second
piece reads them all again. Then the kept state pays only where the compute it saves the next
decision (the new prefix tokens x the measured compute per token) is at least the reads the
second piece adds now. Where it does not, the prompt is prefilled in one piece after the
older kept state (or from nothing) and that state stays. Either way a restored state is one
a decision computed, so exactness is untouched (G18a).

The reads a piece adds are estimated from the share of a layer's experts ``t`` tokens route
at least once, ``1 - (1 - k/n)^t`` (independent routing: trained routers route fewer distinct
experts, so this errs towards one piece), times the seconds it takes to read every expert the
cache misses once (``PieceCosts.miss_read_s``, measured by the session).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class PieceCosts:
    """What the session measured. ``compute_s_per_token``: prefill compute per token (the
    wait for reads left out); None before any measurement. ``miss_read_s``: seconds to read
    every routed expert the cache cannot hold once (0 resident, or with a cache that holds
    them all). ``n_expert`` / ``n_expert_used``: the model's experts and top-k."""

    compute_s_per_token: float | None
    miss_read_s: float = 0.0
    n_expert: int = 0
    n_expert_used: int = 0


@attrs.frozen
class PieceChoice:
    """``keep``: prefill the new prefix tokens, keep the state, then the rest; else one piece.
    ``why``: the comparison, in words (``BMOE_DECIDE``'s ``prefix_plan``)."""

    keep: bool
    why: str


def routed_share(n_tokens: int, n_expert: int, k: int) -> float:
    """The share of a layer's experts that ``n_tokens`` tokens route at least once, each
    choosing ``k`` of ``n_expert`` independently (0 for no token)."""
    if n_tokens <= 0 or n_expert <= 0 or k <= 0:
        return 0.0
    return 1.0 - (1.0 - min(k, n_expert) / n_expert) ** n_tokens


def second_piece_reads_s(n_new: int, n_rest: int, costs: PieceCosts) -> float:
    """The expert reads the split adds: what two pieces of ``n_new`` and ``n_rest`` tokens
    read beyond one piece of both."""
    if costs.miss_read_s <= 0.0 or n_new <= 0 or n_rest <= 0:
        return 0.0
    n, k = costs.n_expert, costs.n_expert_used

    def share(t: int) -> float:
        return routed_share(t, n, k)

    extra = share(n_new) + share(n_rest) - share(n_new + n_rest)
    return costs.miss_read_s * max(0.0, extra)


def choose_pieces(start: int, n_prefix: int, n_tokens: int, costs: PieceCosts) -> PieceChoice:
    """For a prompt of ``n_tokens`` whose kept state (if any) covers ``start`` tokens and
    whose prefix ends at ``n_prefix``: keep the state after the prefix, or prefill in one
    piece."""
    n_new, n_rest = n_prefix - start, n_tokens - n_prefix
    extra = second_piece_reads_s(n_new, n_rest, costs)
    if extra <= 0.0:
        return PieceChoice(True, "kept: a second piece reads nothing more")
    if costs.compute_s_per_token is None:
        why = f"one piece: no compute measured yet; a second piece would read {extra:.2f} s"
        return PieceChoice(False, why)
    saved = costs.compute_s_per_token * n_new
    if saved >= extra:
        why = f"kept: the next decision skips {n_new} tokens ({saved:.2f} s) for {extra:.2f} s of reads now"
        return PieceChoice(True, why)
    return PieceChoice(
        False,
        f"one piece: a second piece would read {extra:.2f} s of experts again to save the next "
        f"decision {n_new} tokens ({saved:.2f} s)",
    )


PRIOR_READ_BYTES_S = 1024 * 1024 * 1024  # until a decision measured the reads: 1 GiB/s


@attrs.define
class PieceMeter:
    """The costs a streamed session measured over its decisions. ``expert_bytes``: all
    routed experts; ``n_expert`` and ``n_expert_used``: the model's.

    The read rate is the latest decision's (the cache and the disk change). The compute per
    token is the least any decision after the session's first measured: the first prefill of
    a session also pays its first touches (the cache's fresh pages, the dense weights' first
    faults; measured here at 5x a later decision's compute under a disk throttle), which
    would make every kept state look worth its reads; and a later decision's time can only be
    inflated (by reads the eval thread did not wait for, by other load), never shrunk, so
    the least is the nearest to the compute alone, and it errs towards one piece."""

    expert_bytes: int
    n_expert: int
    n_expert_used: int
    compute_s_per_token: float | None = None
    read_bytes_s: float = PRIOR_READ_BYTES_S
    observed: int = 0

    def observe(self, n_prefilled: int, prefill_s: float, stall_s: float, bytes_read: int) -> None:
        """One decision's prefill: its tokens, its time, the part of it spent waiting for
        reads, and what it read."""
        if n_prefilled > 0 and prefill_s > 0.0:
            if self.observed > 0:
                compute = max(0.0, prefill_s - stall_s) / n_prefilled
                known = self.compute_s_per_token
                self.compute_s_per_token = compute if known is None else min(known, compute)
            self.observed += 1
        if bytes_read > 0 and stall_s > 0.0:
            self.read_bytes_s = bytes_read / stall_s

    def costs(self, budget_bytes: int) -> PieceCosts:
        """With the cache at ``budget_bytes``: what it cannot hold is read again by every
        piece that routes it."""
        missing = max(0, self.expert_bytes - budget_bytes)
        return PieceCosts(
            compute_s_per_token=self.compute_s_per_token,
            miss_read_s=missing / self.read_bytes_s if self.read_bytes_s > 0 else 0.0,
            n_expert=self.n_expert,
            n_expert_used=self.n_expert_used,
        )
