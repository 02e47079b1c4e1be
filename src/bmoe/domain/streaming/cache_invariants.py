"""The expert cache policy's arguments, checked when it is made, and its invariants, checked
by the tests after every step (the policy's own state, read from here so its module holds
its rules only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bmoe.domain.streaming.victims import VICTIMS

if TYPE_CHECKING:
    from bmoe.domain.streaming.cache_policy import ExpertCachePolicy


def check_arguments(
    budget_bytes: int,
    entry_bytes: Sequence[int],
    n_expert: int,
    n_expert_used: int,
    eviction: str,
    evictions: Sequence[str],
    victims: str,
) -> None:
    """``ValueError`` for an argument ``ExpertCachePolicy`` cannot take."""
    if budget_bytes < 0:
        raise ValueError("budget must be >= 0")
    if n_expert <= 0 or any(b < 0 for b in entry_bytes):
        raise ValueError("n_expert must be > 0 and entry sizes >= 0")
    if n_expert_used < 0:
        raise ValueError("n_expert_used must be >= 0 (0: from the decode requests)")
    if eviction not in evictions:
        raise ValueError(f"eviction must be one of {', '.join(evictions)}, not {eviction!r}")
    if victims not in VICTIMS:
        raise ValueError(f"victims must be one of {', '.join(VICTIMS)}, not {victims!r}")


def check_policy(policy: ExpertCachePolicy) -> None:
    """Invariants: sizes and counters add up; the budget holds unless the last request
    that loaded needed more than it; the protected segment is within its cap and holds
    no entry read ahead and not yet used."""
    c = policy.counters
    resident = policy.resident()
    assert len(set(resident)) == len(resident)
    assert policy.resident_bytes == sum(policy.entry_bytes[layer] for layer, _ in resident)
    assert policy.kept_bytes == sum(policy.entry_bytes[layer] for layer, _ in policy._kept)
    assert policy.kept_bytes <= policy.kept_cap()
    assert not policy._prefetched & policy._kept.keys()
    assert c.misses + c.prefetch_issued + c.warm_issued - c.evictions == len(resident)
    assert policy._prefetched <= set(resident)
    assert policy._warmed <= set(resident)
    assert not policy._warmed & policy._prefetched
    assert not policy._warmed & policy._kept.keys()
    assert c.prefetch_hits + c.prefetch_wasted + len(policy._prefetched) == c.prefetch_issued
    assert c.rereads <= c.misses + c.prefetch_issued + c.warm_issued
    assert c.bytes_read >= policy.resident_bytes
    assert all(policy.entry_bytes[layer] > 0 and 0 <= e < policy.n_expert for layer, e in resident)
    assert policy.resident_bytes <= max(policy.budget_bytes, policy._last_request_bytes)
