"""The kept prefix states of decisions, and when to keep any (``--decide-prefix-cache``).

A kept state is a copy of the whole model sequence state (recurrent layers included) after
the tokens of a prefix. It is restored when a later prompt starts with those tokens, so
only the rest is prefilled. The blob is opaque here: the backend made it and only the
backend reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal, Protocol

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.kv_reuse import extends
from bmoe.errors import ConfigError

StateBlob = npt.NDArray[np.uint8]
"""A saved sequence state, as the backend wrote it (read-only)."""

PrefixCacheMode = Literal["auto", "on", "off"]
PREFIX_CACHE_MODES: tuple[PrefixCacheMode, ...] = ("auto", "on", "off")


def resolve_prefix_cache(mode: PrefixCacheMode, *, prefill_device: bool) -> bool:
    """Whether decisions keep a prefix state.

    ``auto`` keeps one where prefilling a prompt in two pieces costs about what the pieces
    cost together: the CPU prefill. A prefill device (every graph costing a whole pass,
    and the model state moved by rebinding the cache tensors, which saved-state views do
    not follow) resolves to off, and ``on`` there is refused (``ConfigError``).
    """
    if mode not in PREFIX_CACHE_MODES:
        raise ConfigError(f"decide prefix cache must be one of {', '.join(PREFIX_CACHE_MODES)}, not {mode!r}")
    if mode == "on" and prefill_device:
        raise ConfigError(
            "--decide-prefix-cache on cannot be used with a prefill device: a saved state would be "
            "read from memory the model no longer uses (use auto or off)"
        )
    return mode == "on" or (mode == "auto" and not prefill_device)


@attrs.frozen(eq=False)
class KeptState:
    """The state after ``tokens`` (never empty)."""

    tokens: tuple[int, ...]
    blob: StateBlob

    @property
    def nbytes(self) -> int:
        return int(self.blob.nbytes)


class IPrefixCache(Protocol):
    """Where decisions keep prefix states. Holding nothing is always a valid state."""

    def lookup(self, prefix: Sequence[int]) -> KeptState | None:
        """The longest kept state whose tokens ``prefix`` equals or extends (marked as just
        used), or None."""
        ...

    def store(self, tokens: Sequence[int], blob: StateBlob) -> None:
        """Keep ``blob`` as the state after ``tokens`` (replacing one with the same tokens)."""
        ...

    def discard(self, tokens: Sequence[int]) -> None:
        """Forget the state kept for exactly ``tokens``, if any (e.g. it failed to load)."""
        ...

    def clear(self) -> None:
        """Forget every kept state (a chat turn does, to give the RAM back)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes the kept states hold."""
        ...


class LruPrefixCache:
    """Up to ``slots`` kept states, the least recently used one dropped first
    (``--decide-prefix-slots K``): K agents, or K branches of one, each keep theirs."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ConfigError(f"decide prefix slots must be at least 1, not {slots}")
        self.slots = slots
        self._states: OrderedDict[tuple[int, ...], KeptState] = OrderedDict()

    def lookup(self, prefix: Sequence[int]) -> KeptState | None:
        hits = [kept for kept in self._states.values() if extends(prefix, kept.tokens)]
        if not hits:
            return None
        best = max(hits, key=lambda kept: len(kept.tokens))
        self._states.move_to_end(best.tokens)
        return best

    def store(self, tokens: Sequence[int], blob: StateBlob) -> None:
        key = tuple(tokens)
        if not key:
            raise ValueError("a kept state needs at least one token")
        self._states[key] = KeptState(key, blob)
        self._states.move_to_end(key)
        while len(self._states) > self.slots:
            self._states.popitem(last=False)

    def discard(self, tokens: Sequence[int]) -> None:
        self._states.pop(tuple(tokens), None)

    def clear(self) -> None:
        self._states.clear()

    @property
    def nbytes(self) -> int:
        return sum(kept.nbytes for kept in self._states.values())

    def __len__(self) -> int:
        return len(self._states)

    def kept(self) -> list[KeptState]:
        """The kept states, least recently used first."""
        return list(self._states.values())

    def check_valid(self) -> None:
        """Assert the invariants (for tests): at most ``slots``, keyed by their own tokens."""
        assert len(self._states) <= self.slots
        for key, kept in self._states.items():
            assert key == kept.tokens and len(key) > 0


class LastPrefixCache(LruPrefixCache):
    """One kept state: the latest prefix stored (the default)."""

    def __init__(self) -> None:
        super().__init__(1)


def new_prefix_cache(slots: int = 1) -> LruPrefixCache:
    """The cache for ``--decide-prefix-slots slots``: ``LastPrefixCache`` for 1."""
    return LastPrefixCache() if slots == 1 else LruPrefixCache(slots)
