"""The usage profile: which experts a model's workload routes, learned across processes, and
what a new process warms its cache with (``--profile``).

Every process starts with an empty expert cache, and the first tokens pay for filling it
(a cold start). The profile keeps, per (layer, expert), how many routed slots chose it,
*decayed*: when a process adds the routing it saw, the counts already in the profile are
first multiplied by ``0.5 ** (new tokens / half_life_tokens)``, so the profile follows a
workload that drifts and old sessions fade. Processes merge into one profile per model
(keyed by what identifies the model file's content, never its path).

At open, the hottest entries (most counts first; ties: layer, then expert) are read ahead
into the cache, up to ``share`` of the budget and never more than the budget less one token
cycle (the room decode's own misses need), in file order (layer by layer, experts
ascending: the first layers first, which is also what the first request needs first). They
are reads ahead like any other (``ExpertCachePolicy.prefetch`` with ``hot=True``: they
enter probation's most recent end): a request that routes to one adopts it (waiting only
for that read if it is still running), a request's own misses go to the front of the
lanes' queue, and one never used is evicted like any cold entry. So a wrong profile costs
reads, never a wrong output: the cache changes what is read, not what is computed.

Pure: counts in, profiles and warm sets out. The file (JSON, written atomically, merged
under a lock) is ``adapters.usage_profile_file``'s; the session's use of it
``runtime.usage_profile``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

PROFILE_FORMAT = "bmoe-usage-profile"
PROFILE_VERSION = 1
HALF_LIFE_TOKENS = 8192.0  # a profile's counts halve every this many new tokens
WARM_SHARE = 0.75  # of the budget, at most, warmed at open


class ProfileRejected(ValueError):
    """A profile that cannot be trusted (corrupt, truncated, another model's, another
    version); the message says why in a few words."""


@attrs.frozen
class UsageProfile:
    """Decayed routing counts of one model. ``counts[layer * n_expert + expert]``;
    ``tokens``: the decayed number of tokens they come from; ``sessions``: how many
    processes merged into it (not decayed; for the user)."""

    model_key: str
    n_layer: int
    n_expert: int
    counts: tuple[float, ...]
    tokens: float = 0.0
    sessions: int = 0

    def __attrs_post_init__(self) -> None:
        if self.n_layer <= 0 or self.n_expert <= 0:
            raise ProfileRejected("the shape must be positive")
        if len(self.counts) != self.n_layer * self.n_expert:
            raise ProfileRejected(
                f"{len(self.counts)} counts for {self.n_layer} layers x {self.n_expert} experts"
            )
        if not all(math.isfinite(c) and c >= 0 for c in self.counts):
            raise ProfileRejected("a count is negative or not a number")
        if not (math.isfinite(self.tokens) and self.tokens >= 0 and self.sessions >= 0):
            raise ProfileRejected("the token or session count is negative or not a number")

    @classmethod
    def empty(cls, model_key: str, n_layer: int, n_expert: int) -> UsageProfile:
        return cls(model_key, n_layer, n_expert, (0.0,) * (n_layer * n_expert))

    def count(self, layer: int, expert: int) -> float:
        return self.counts[layer * self.n_expert + expert]


def routed_tokens(routed: Sequence[int], n_layer: int, n_expert: int, k: int) -> float:
    """How many tokens a routing count comes from: the most slots any layer routed, over
    ``k`` slots a token (every MoE layer sees every token; layers without experts none)."""
    if k <= 0:
        raise ValueError("k must be > 0")
    most = max(
        (sum(routed[layer * n_expert : (layer + 1) * n_expert]) for layer in range(n_layer)), default=0
    )
    return most / k


def merge(
    profile: UsageProfile,
    routed: Sequence[int],
    tokens: float,
    *,
    half_life_tokens: float = HALF_LIFE_TOKENS,
    new_session: bool = False,
) -> UsageProfile:
    """``profile`` after ``tokens`` more tokens routed ``routed`` (slots per entry, same
    shape): the old counts decay by ``0.5 ** (tokens / half_life_tokens)``, the new ones
    add. ``new_session``: this is a process's first merge (counted in ``sessions``)."""
    if len(routed) != len(profile.counts):
        raise ValueError("the routing has another shape than the profile")
    if tokens < 0 or half_life_tokens <= 0:
        raise ValueError("tokens must be >= 0 and the half-life > 0")
    if any(r < 0 for r in routed):
        raise ValueError("routed counts must be >= 0")
    decay = 0.5 ** (tokens / half_life_tokens)
    return attrs.evolve(
        profile,
        counts=tuple(c * decay + r for c, r in zip(profile.counts, routed, strict=True)),
        tokens=profile.tokens * decay + tokens,
        sessions=profile.sessions + (1 if new_session else 0),
    )


@attrs.frozen
class WarmSet:
    """What to read at open: ``targets`` ``[(layer, experts ascending)]`` in layer order;
    ``bytes``: their size; ``share``: the profile's counts they hold (0..1)."""

    targets: tuple[tuple[int, tuple[int, ...]], ...]
    bytes: int
    share: float

    @property
    def entries(self) -> int:
        return sum(len(experts) for _, experts in self.targets)


def warm_set(
    profile: UsageProfile,
    entry_bytes: Sequence[int],
    budget_bytes: int,
    token_cycle_bytes: int,
    share: float = WARM_SHARE,
) -> WarmSet:
    """The hottest entries (counts > 0, most first; ties: layer, then expert) that fit in
    ``min(share * budget, budget - token cycle)`` bytes, skipping any that does not fit,
    grouped by layer in file order. Layers without experts (``entry_bytes`` 0) hold none."""
    if not 0.0 <= share <= 1.0:
        raise ValueError("the warm share must be in [0, 1]")
    if len(entry_bytes) != profile.n_layer:
        raise ValueError("entry sizes for another number of layers than the profile's")
    room = min(int(share * budget_bytes), budget_bytes - token_cycle_bytes)
    n = profile.n_expert
    ranked = sorted(
        (i for i, c in enumerate(profile.counts) if c > 0 and entry_bytes[i // n] > 0),
        key=lambda i: (-profile.counts[i], i),
    )
    chosen: dict[int, list[int]] = {}
    used = 0
    held = 0.0
    for i in ranked:
        size = entry_bytes[i // n]
        if used + size > room:
            continue
        used += size
        held += profile.counts[i]
        chosen.setdefault(i // n, []).append(i % n)
    total = sum(c for i, c in enumerate(profile.counts) if entry_bytes[i // n] > 0)
    targets = tuple((layer, tuple(sorted(chosen[layer]))) for layer in sorted(chosen))
    return WarmSet(targets, used, held / total if total > 0 else 0.0)


def to_document(profile: UsageProfile) -> dict[str, Any]:
    """The profile as a JSON-ready document."""
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model_key": profile.model_key,
        "n_layer": profile.n_layer,
        "n_expert": profile.n_expert,
        "tokens": profile.tokens,
        "sessions": profile.sessions,
        "counts": [
            list(profile.counts[layer * profile.n_expert : (layer + 1) * profile.n_expert])
            for layer in range(profile.n_layer)
        ],
    }


def from_document(doc: object, model_key: str, n_layer: int, n_expert: int) -> UsageProfile:
    """The profile in ``doc`` if it is one of this model (``model_key``, shape); raises
    ``ProfileRejected`` saying why it is not to be trusted otherwise."""
    if not isinstance(doc, Mapping) or doc.get("format") != PROFILE_FORMAT:
        raise ProfileRejected("not a bmoe usage profile")
    if doc.get("version") != PROFILE_VERSION:
        raise ProfileRejected(f"version {doc.get('version')!r}, this bmoe reads {PROFILE_VERSION}")
    if doc.get("model_key") != model_key:
        raise ProfileRejected("learned on another model")
    if doc.get("n_layer") != n_layer or doc.get("n_expert") != n_expert:
        raise ProfileRejected("another shape than the model's")
    rows = doc.get("counts")
    if not isinstance(rows, list) or len(rows) != n_layer:
        raise ProfileRejected("the counts are missing or truncated")
    counts: list[float] = []
    for row in rows:
        if not isinstance(row, list) or len(row) != n_expert:
            raise ProfileRejected("the counts are missing or truncated")
        if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in row):
            raise ProfileRejected("a count is not a number")
        counts.extend(float(c) for c in row)
    tokens, sessions = doc.get("tokens"), doc.get("sessions")
    if not isinstance(tokens, int | float) or not isinstance(sessions, int) or isinstance(sessions, bool):
        raise ProfileRejected("the token or session count is missing")
    return UsageProfile(model_key, n_layer, n_expert, tuple(counts), float(tokens), sessions)
