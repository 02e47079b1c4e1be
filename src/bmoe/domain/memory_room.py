"""The memory room: how much more memory this process may take, and what says so.

One figure for everything that sizes memory (``--cache-mb auto`` at start, the governor
while it runs): the machine's ``MemAvailable``, lowered to what is left under the limits of
the process's own memory cgroup and of each of its ancestors (a limit binds the whole
subtree below it, so a parent's lower limit, or its other children's usage, leaves less).
``bmoe.adapters.memory_room`` reads the files; this is the arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen
class CgroupLevel:
    """One group of the chain from the process's own group up to the top it can see:
    ``limit_bytes`` (the lowest of its limits: v1 ``memory.limit_in_bytes``, v2
    ``memory.max`` and ``memory.high``) and ``used_bytes`` (its usage, its children's
    included, less the inactive file pages the kernel reclaims first)."""

    limit_bytes: int
    used_bytes: int

    @property
    def room_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)


@attrs.frozen
class MemoryRoom:
    """What the machine and the process's cgroups said at one moment.

    - ``available_bytes``: ``MemAvailable`` (the machine's; ``MemTotal`` where the kernel
      has no ``MemAvailable``);
    - ``total_bytes``: ``MemTotal`` (0 where unknown);
    - ``limit_bytes``: the lowest limit over the process's group and its ancestors, None
      where none is set;
    - ``group_room_bytes``: the least room over those limited groups (limit less usage),
      None where none is limited;
    - ``group``: the process's own group as ``/proc/self/cgroup`` names it ("" without one).
    """

    available_bytes: int
    total_bytes: int = 0
    limit_bytes: int | None = None
    group_room_bytes: int | None = None
    group: str = ""

    @classmethod
    def of(
        cls, available_bytes: int, total_bytes: int, levels: Iterable[CgroupLevel], group: str = ""
    ) -> MemoryRoom:
        """The room from the machine's figures and the limited groups of the chain."""
        chain = list(levels)
        if not chain:
            return cls(available_bytes, total_bytes, group=group)
        return cls(
            available_bytes,
            total_bytes,
            limit_bytes=min(level.limit_bytes for level in chain),
            group_room_bytes=min(level.room_bytes for level in chain),
            group=group,
        )

    @property
    def room_bytes(self) -> int:
        """What this process may still take: ``MemAvailable``, lowered to its cgroups' room."""
        if self.group_room_bytes is None:
            return self.available_bytes
        return min(self.available_bytes, self.group_room_bytes)

    @property
    def usable_bytes(self) -> int:
        """All the process could use: ``MemTotal``, or the cgroup limit where lower."""
        if self.limit_bytes is None:
            return self.total_bytes
        return min(self.total_bytes, self.limit_bytes) if self.total_bytes else self.limit_bytes

    def describe(self) -> str:
        """Where the room comes from, in words: ``under a cgroup limit of 2048 MiB`` or
        ``MemAvailable``."""
        if self.limit_bytes is None:
            return "MemAvailable"
        return f"under a cgroup limit of {self.limit_bytes / (1 << 20):.0f} MiB"
