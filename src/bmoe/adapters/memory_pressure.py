"""What the machine says about memory, as the governor's readings
(:class:`bmoe.domain.streaming.governor.MemoryReading`).

- ``/proc/meminfo``: ``MemTotal`` and ``MemAvailable``;
- the process's own memory cgroup (from ``/proc/self/cgroup``, not the hierarchy's root):
  v2 ``memory.max`` and ``memory.current``, v1 ``memory.limit_in_bytes`` and
  ``memory.usage_in_bytes``; its usage less the inactive file pages of ``memory.stat``
  (page cache the kernel reclaims first, such as a model file's read-ahead), so that a
  group full of clean cache does not read as full;
- PSI: the v2 group's ``memory.pressure``, else the machine's ``/proc/pressure/memory``
  (``some avg10``: the share of the last 10 s some task stalled on memory), None where the
  kernel has neither.

Parsing is pure (the ``parse_*`` functions); :class:`MemoryProbe` reads the files, under
roots a test can point elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from bmoe.adapters.system_memory import UNLIMITED, parse_meminfo, read_cgroup_int
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


def parse_stat_value(text: str, *keys: str) -> int:
    """The first of ``keys`` found in a ``memory.stat`` (0 when none is)."""
    found = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return next((found[k] for k in keys if k in found), 0)


def own_group(proc_cgroup: str, cgroup_root: Path, mounts: str) -> tuple[int, Path] | None:
    """``(version, folder)`` of this process's memory cgroup, None without one."""
    v2_root = v1_root = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and v2_root is None:
            v2_root = Path(fields[1])
        elif len(fields) >= 4 and fields[2] == "cgroup" and "memory" in fields[3].split(","):
            v1_root = Path(fields[1])
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if v1_root is not None and "memory" in controllers.split(","):
            return 1, _under(cgroup_root, v1_root) / path.lstrip("/")
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "" and v2_root is not None:
            folder = _under(cgroup_root, v2_root) / parts[2].lstrip("/")
            if (folder / "memory.max").exists():
                return 2, folder
    return None


def _under(cgroup_root: Path, mount: Path) -> Path:
    """``mount`` (a hierarchy's mount point) seen from ``cgroup_root`` (``/sys/fs/cgroup``
    itself, or a test's stand-in for it)."""
    try:
        return cgroup_root / mount.relative_to("/sys/fs/cgroup")
    except ValueError:
        return mount


_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "inactive_file")),
    2: ("memory.max", "memory.current", ("inactive_file",)),
}


class MemoryProbe:
    """Reads the machine's memory state; ``read()`` gives one :class:`MemoryReading`."""

    def __init__(self, proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self.proc = proc
        self.group = own_group(_read(proc / "self" / "cgroup"), cgroup_root, _read(proc / "self" / "mounts"))

    def read(self) -> MemoryReading:
        total, available = parse_meminfo(_read(self.proc / "meminfo"))
        usable = total or 0
        room = available if available is not None else usable
        pressure_text = ""
        if self.group is not None:
            version, folder = self.group
            limit_file, usage_file, inactive = _FILES[version]
            limit = read_cgroup_int(folder / limit_file)
            usage = read_cgroup_int(folder / usage_file)
            if limit is not None and usage is not None and limit < UNLIMITED // 2:
                used = max(0, usage - parse_stat_value(_read(folder / "memory.stat"), *inactive))
                usable = min(usable, limit) if usable else limit
                room = min(room, max(0, limit - used))
            if version == 2:
                pressure_text = _read(folder / "memory.pressure")
        if not pressure_text:
            pressure_text = _read(self.proc / "pressure" / "memory")
        return MemoryReading(
            room_bytes=room, usable_bytes=usable, pressure_pct=parse_psi_some_avg10(pressure_text)
        )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
