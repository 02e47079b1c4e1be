"""What a vision encoder keeps of the images it has seen, within a byte limit (pure policy).

A conversation sends its earlier images again with every turn. The encoder keeps, by the
image's rows' key (``ImageRows.key``, named by its pixels), its embeddings (what encoding
it costs) and the picture's bytes as sent (to encode it again once its embeddings were
pushed out), least recently used out past ``limit_bytes`` (``--image-cache-mb``; the
streamed run sets that much memory aside for it, as for the prompt cache).

A turn's own pictures are *pinned* (``put(..., pinned=True)``) for ``pin_turns`` turns
(``begin_turn`` starts one): a prompt is fed after it is tokenized, perhaps after other
prompts were tokenized beside it (parallel slots), and the pictures it places must still be
there, however many they are. Embeddings are never pinned: a turn that places more
than the limit holds re-encodes, it does not grow the cache. A value larger than the limit
alone is not kept (``refused``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

import attrs

DEFAULT_IMAGE_CACHE_MIB = 64
"""``--image-cache-mb``'s default: a few screenshots' embeddings on a real model (a
1920x1080 one is some 2,000 rows of 2,048 floats, 16 MiB), many on a small one."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@attrs.define
class KeepCounters:
    """Cumulative counts since the keep was made."""

    hits: int = 0  # ``get`` found the key
    misses: int = 0  # ``get`` did not
    evicted: int = 0  # entries pushed out for room
    refused: int = 0  # values larger than the limit alone: not kept


@attrs.define
class _Entry(Generic[V]):
    value: V
    nbytes: int
    pinned_turn: int | None  # the turn it was pinned in (None: not pinned)


class ImageKeep(Generic[K, V]):
    """Values of known sizes kept by key, least recently used out past ``limit_bytes``
    (entries pinned in the last ``pin_turns`` turns excepted)."""

    def __init__(self, limit_bytes: int, pin_turns: int = 1) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
        if pin_turns < 1:
            raise ValueError(f"pin_turns must be >= 1, not {pin_turns}")
        self.limit_bytes = limit_bytes
        self.pin_turns = pin_turns
        self.counters = KeepCounters()
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._turn = 0
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """The bytes the kept values take."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        """The keys kept, least recently used first."""
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def begin_turn(self) -> None:
        """A new turn: pins ``pin_turns`` old are lifted (what they held over the limit goes)."""
        self._turn += 1
        self._evict()

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), None where none is."""
        entry = self._entries.get(key)
        if entry is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: K, value: V, nbytes: int, *, pinned: bool = False) -> bool:
        """Keep ``value`` (``nbytes`` long) for ``key``; ``pinned``: kept for ``pin_turns``
        turns, this one counted, whatever the limit. False where it was not kept (larger than
        the limit alone, not pinned)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, not {nbytes}")
        self.discard(key)
        if nbytes > self.limit_bytes and not pinned:
            self.counters.refused += 1
            return False
        self._entries[key] = _Entry(value, nbytes, self._turn if pinned else None)
        self._bytes += nbytes
        self._evict()
        return True

    def discard(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.nbytes

    def _evict(self) -> None:
        """Least recently used first, until within the limit (pinned entries stay)."""
        for key in list(self._entries):
            if self._bytes <= self.limit_bytes:
                return
            entry = self._entries[key]
            if self._pinned(entry):
                continue
            del self._entries[key]
            self._bytes -= entry.nbytes
            self.counters.evicted += 1

    def _pinned(self, entry: _Entry[V]) -> bool:
        return entry.pinned_turn is not None and self._turn - entry.pinned_turn < self.pin_turns

    def check_valid(self) -> None:
        """The invariants: the bytes add up, and past the limit only pinned entries are kept."""
        assert self._bytes == sum(e.nbytes for e in self._entries.values())
        assert self._bytes <= self.limit_bytes or all(self._pinned(e) for e in self._entries.values())
