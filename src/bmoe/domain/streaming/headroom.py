"""What ``--cache-mb auto`` leaves free: a reserve beside each limit that binds the run.

Two limits can bind a streamed run, and the room (``MemoryRoom``) reads both:

- **the machine** (``MemAvailable``): other programs, the page cache and the system need room
  later, and nothing tells this process how much. The floor left to them is sized from the
  machine, ``MemTotal / 16`` between 512 MiB and 2 GiB (``machine_floor_bytes``): a 4 or 8 GiB
  phone leaves 512 MiB (a fixed GiB was a quarter of the 4 GiB one), a 24 GiB PC 1.5 GiB, a
  64 GiB desktop 2 GiB. Where ``MemTotal`` is unknown, 1 GiB (the rule before).
- **the process's own memory cgroup** (its limit less its usage, and each ancestor's): that
  room is this run's alone (a container's, a bench's, a phone app's limit), so nothing else
  will take it; what it must keep is what this run itself allocates after the room is read
  (``run_margin_bytes``): the read lanes' buffers and the reads in flight beyond the budget,
  and a slack for the allocator, the Python heap and the pages of evicted entries still on
  their way back (the room's reading counts the group's active file pages as taken, a
  cushion the kernel reclaims first). A fixed GiB there was half of a 2 GiB limit.

The compute buffer still to come and the prompt cache's memory tier (``--cache-ram``) are
this run's too, and are subtracted beside either reserve (``domain.streaming.budget``).
Pure arithmetic; ``bmoe.adapters.memory_room`` reads the figures.
"""

from __future__ import annotations

import attrs

from bmoe.domain.memory_room import MemoryRoom

MIB = 1024 * 1024
MACHINE_FLOOR_SHARE = 16  # the machine keeps MemTotal / 16 ...
MACHINE_FLOOR_MIN_MIB = 512  # ... at least this ...
MACHINE_FLOOR_MAX_MIB = 2048  # ... at most this
MACHINE_FLOOR_UNKNOWN_MIB = 1024  # MemTotal unknown: the fixed floor of before
RUN_SLACK_MIB = 64  # in a cgroup: the allocator, the Python heap, released pages not yet gone.
# The room already counts the group's active file pages as taken (libraries, text read: 50-80 MiB
# for the bench model), which the kernel reclaims before it kills: measured, the 5.2 GiB bench
# model in 2 GiB held 73 MiB beyond its full cache, dense part, KV and compute buffer (the lanes'
# 20 among them), and after a 2,048-token prompt a given --cache-mb 1,481 ran where 1,504 was killed
READS_IN_FLIGHT = 2  # per lane: its bounce buffer, and a read landing before its eviction lands


def machine_floor_bytes(total_bytes: int) -> int:
    """What the rest of the machine keeps: ``MemTotal / 16`` between 512 MiB and 2 GiB (1 GiB
    where ``MemTotal`` is unknown)."""
    if total_bytes <= 0:
        return MACHINE_FLOOR_UNKNOWN_MIB * MIB
    share = total_bytes // MACHINE_FLOOR_SHARE
    return max(MACHINE_FLOOR_MIN_MIB * MIB, min(MACHINE_FLOOR_MAX_MIB * MIB, share))


def run_margin_bytes(lanes: int, entry_bytes: int) -> int:
    """What the run keeps inside its own cgroup beyond the budget, the compute buffer and the
    prompt cache: each lane's reads in flight (``READS_IN_FLIGHT`` entries of
    ``entry_bytes``, the largest layer's expert) and ``RUN_SLACK_MIB``."""
    return RUN_SLACK_MIB * MIB + max(1, lanes) * READS_IN_FLIGHT * max(0, entry_bytes)


@attrs.frozen
class Headroom:
    """The limit that binds ``auto``: ``"machine"`` (``MemAvailable``, less the machine's
    floor) or ``"cgroup"`` (the group's room, less the run's margin); ``room_bytes``: that
    limit's room, ``reserve_bytes``: what ``auto`` keeps beside it."""

    limit: str
    room_bytes: int
    reserve_bytes: int

    @property
    def free_bytes(self) -> int:
        """The room less the reserve: what the cache, the compute buffer still to come and the
        prompt states may take together."""
        return max(0, self.room_bytes - self.reserve_bytes)

    @classmethod
    def of(cls, room: MemoryRoom, *, run_margin: int) -> Headroom:
        """The binding limit of ``room``: the smaller of the machine's room less its floor and
        the cgroup's room (where one is limited) less the run's margin."""
        machine = cls("machine", room.available_bytes, machine_floor_bytes(room.total_bytes))
        if room.group_room_bytes is None:
            return machine
        group = cls("cgroup", room.group_room_bytes, run_margin)
        return group if group.free_bytes <= machine.free_bytes else machine

    def describe(self) -> str:
        """``1536 MiB left to the machine`` or ``84 MiB kept free in the cgroup``."""
        mib = self.reserve_bytes / MIB
        if self.limit == "cgroup":
            return f"{mib:.0f} MiB kept free in the cgroup"
        return f"{mib:.0f} MiB left to the machine"
