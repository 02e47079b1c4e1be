"""What the machine says about memory, as the governor's readings
(:class:`bmoe.domain.streaming.governor.MemoryReading`).

- the room and what the process could use at most: :class:`bmoe.adapters.memory_room.ProcessMemoryRoom`,
  the one reading of the process's memory room (``MemAvailable`` lowered to what is left under
  its own cgroup's limits and its ancestors'), the same that sizes ``--cache-mb auto``;
- PSI: the v2 group's ``memory.pressure``, else the machine's ``/proc/pressure/memory``
  (``some avg10``: the share of the last 10 s some task stalled on memory), None where the
  kernel has neither. Not the machine's where the process's own cgroup limit binds its room
  (a v1 group, which has no PSI of its own): that figure is other groups' stalls, and the
  group's own room is the guard. Measured: a process thrashing in another 2 GiB group left
  the machine's ``avg10`` above 10% for the next run, whose governor then shrank a 1,617 MiB
  budget to under 900 MiB resident and decoded at half the speed of a fixed 1,536.
- the times the process's own group hit its limit since the last reading (v1
  ``memory.failcnt``, v2 ``memory.events``' ``max``), where that limit binds: the group's own
  sign of pressure, v1's only one. Measured: the 48-layer bench model in 4 GiB ran its auto
  budget at the limit (152 hits while the cache filled), its lanes' landing twice as slow.

Parsing is pure (``parse_psi_some_avg10``); :class:`MemoryProbe` reads the files, under
roots a test can point elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from bmoe.adapters.memory_room import SYS_CGROUP, CgroupPlace, ProcessMemoryRoom
from bmoe.domain.streaming.governor import MemoryReading


def parse_psi_some_avg10(text: str) -> float | None:
    """``avg10`` of the ``some`` line of a PSI file."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


class MemoryProbe:
    """Reads the machine's memory state; ``read()`` gives one :class:`MemoryReading`."""

    def __init__(self, proc: Path = Path("/proc"), cgroup_root: Path = SYS_CGROUP) -> None:
        self.proc = proc
        self.room = ProcessMemoryRoom(proc, cgroup_root)
        self._hits: int | None = None  # the group's limit hits at the last reading

    @property
    def group(self) -> CgroupPlace | None:
        """The process's memory cgroup, None without one."""
        return self.room.place

    def read(self) -> MemoryReading:
        room = self.room.read()
        pressure_text = ""
        if self.group is not None and self.group.version == 2:
            pressure_text = _read(self.group.folder / "memory.pressure")
        own_limit_binds = room.group_room_bytes is not None and room.group_room_bytes < room.available_bytes
        if not pressure_text and not own_limit_binds:
            pressure_text = _read(self.proc / "pressure" / "memory")
        hits = self._limit_hits()
        new_hits = (
            0 if hits is None or self._hits is None or not own_limit_binds else max(0, hits - self._hits)
        )
        self._hits = hits
        return MemoryReading(
            room_bytes=room.room_bytes,
            usable_bytes=room.usable_bytes,
            pressure_pct=parse_psi_some_avg10(pressure_text),
            limit_hits=new_hits,
        )

    def _limit_hits(self) -> int | None:
        """The process's own group's limit hits so far (None without a group or the file)."""
        group = self.group
        if group is None:
            return None
        if group.version == 1:
            text = _read(group.folder / "memory.failcnt").strip()
            return int(text) if text.isdigit() else None
        for line in _read(group.folder / "memory.events").splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                return int(value)
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
