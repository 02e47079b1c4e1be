"""The memory room as the machine says it (:class:`bmoe.domain.memory_room.MemoryRoom`):
``/proc/meminfo`` and the process's own memory cgroup with its ancestors.

- *Which group*: the v1 line of ``/proc/self/cgroup`` that names the ``memory`` controller,
  else its v2 line (``0::``), placed under the hierarchy's mount found in
  ``/proc/self/mountinfo``: the mount's root (its 4th field) is the part of the group's path
  the mount already stands for, so a container that sees its own group as ``/`` (a cgroup
  namespace, or a v1 mount of the group's folder) reads the mount point itself.
- *Which limits*: the group's and each ancestor's up to the mount (a limit binds everything
  below it); v1 ``memory.limit_in_bytes`` and ``memory.usage_in_bytes`` (an ancestor with
  ``memory.use_hierarchy`` 0 does not count its children: the walk stops there), v2
  ``memory.max`` (``memory.high`` where lower) and ``memory.current``; each usage less the
  inactive file pages of the group's ``memory.stat`` (page cache the kernel reclaims first,
  such as a model file's read-ahead), so that a group full of clean cache does not read as full.
- No group, no memory controller, no limit, or files that cannot be read: ``MemAvailable``
  alone.

Parsing is pure (the ``parse_*`` functions and ``own_group``); :class:`ProcessMemoryRoom`
reads the files, under roots a test can point at a fake tree.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.domain.memory_room import CgroupLevel, MemoryRoom
from bmoe.domain.metrics import parse_proc_status

MIB = 1 << 20

UNLIMITED = 1 << 60
_LIMITED = UNLIMITED // 2  # v1 writes "no limit" as 9223372036854771712, v2 as "max"
SYS_CGROUP = Path("/sys/fs/cgroup")


def read_cgroup_int(path: Path) -> int | None:
    """A cgroup file's number (``max``: ``UNLIMITED``); None where it cannot be read."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """``(MemTotal, MemAvailable)`` in bytes, from the text of ``/proc/meminfo``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
            values[key] = int(fields[0]) * 1024
    return values.get("MemTotal"), values.get("MemAvailable")


def parse_stat_value(text: str, *keys: str) -> int:
    """The first of ``keys`` found in a ``memory.stat`` (0 when none is)."""
    found = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return next((found[k] for k in keys if k in found), 0)


@attrs.frozen
class CgroupMount:
    """One cgroup hierarchy's mount, from a ``/proc/self/mountinfo`` line: ``root`` is the
    group the mount point shows (``/`` unless a container sees its own group as the top)."""

    root: str
    point: Path
    version: int  # 1 or 2
    controllers: tuple[str, ...]  # v1: the super options (``rw,memory``); v2: none


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup mounts of a ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(CgroupMount(fields[3], point, 2, ()))
        elif tail[0] == "cgroup" and len(tail) >= 3:
            mounts.append(CgroupMount(fields[3], point, 1, tuple(tail[2].split(","))))
    return mounts


@attrs.frozen
class CgroupPlace:
    """The process's memory cgroup: ``folder`` (where its files are) under ``top`` (the
    mount point: the highest group this process can see), ``path`` as
    ``/proc/self/cgroup`` names it."""

    version: int
    folder: Path
    top: Path
    path: str

    def chain(self) -> list[Path]:
        """The group's folder and each ancestor's, up to the top, nearest first."""
        folders = [self.folder]
        while folders[-1] != self.top and self.top in folders[-1].parents:
            folders.append(folders[-1].parent)
        return folders


def own_group(proc_cgroup: str, cgroup_root: Path, mountinfo: str) -> CgroupPlace | None:
    """Where this process's memory cgroup is (v1 ``memory`` controller first, else v2),
    None without one. ``cgroup_root`` stands for ``/sys/fs/cgroup`` (a test's fake tree)."""
    mounts = parse_mountinfo(mountinfo)
    v1 = [m for m in mounts if m.version == 1 and "memory" in m.controllers]
    v2 = [m for m in mounts if m.version == 2]
    lines = [line.split(":", 2) for line in proc_cgroup.splitlines()]
    for parts in lines:
        if len(parts) == 3 and v1 and "memory" in parts[1].split(","):
            return _place(1, parts[2], v1, cgroup_root)
    for parts in lines:
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "" and v2:
            place = _place(2, parts[2], v2, cgroup_root)
            # the memory controller is on where the group (or one above) has memory.max
            if any((folder / "memory.max").exists() for folder in place.chain()):
                return place
    return None


def _place(version: int, path: str, mounts: list[CgroupMount], cgroup_root: Path) -> CgroupPlace:
    """``path`` (from /proc/self/cgroup) under the mount whose root holds it; a path no
    mount holds (a group outside a container's namespace) is the mount point itself."""
    held = [(m, rest) for m in mounts if (rest := _below(path, m.root)) is not None]
    mount, rest = held[0] if held else (mounts[0], "")
    top = _under(cgroup_root, mount.point)
    return CgroupPlace(version, top / rest if rest else top, top, path)


def _below(path: str, root: str) -> str | None:
    """``path`` relative to a mount's ``root`` ("" for the root itself), None outside it."""
    root = root.rstrip("/")
    if path.rstrip("/") == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :].rstrip("/")
    return None


def _under(cgroup_root: Path, point: Path) -> Path:
    """A mount point seen from ``cgroup_root`` (``/sys/fs/cgroup`` itself, or a test's
    stand-in for it)."""
    try:
        return cgroup_root / point.relative_to(SYS_CGROUP)
    except ValueError:
        return point


_FILES = {
    1: (("memory.limit_in_bytes",), "memory.usage_in_bytes", ("total_inactive_file", "inactive_file")),
    2: (("memory.max", "memory.high"), "memory.current", ("inactive_file",)),
}


def read_levels(place: CgroupPlace) -> list[CgroupLevel]:
    """The limited groups of ``place``'s chain, nearest first (a group without a limit, or
    whose files cannot be read, adds nothing)."""
    limit_files, usage_file, inactive = _FILES[place.version]
    levels = []
    for i, folder in enumerate(place.chain()):
        if place.version == 1 and i > 0 and read_cgroup_int(folder / "memory.use_hierarchy") == 0:
            break  # this v1 ancestor neither counts nor limits its children
        limits = [v for f in limit_files if (v := read_cgroup_int(folder / f)) is not None]
        usage = read_cgroup_int(folder / usage_file)
        if not limits or usage is None or min(limits) >= _LIMITED:
            continue
        used = max(0, usage - parse_stat_value(_read(folder / "memory.stat"), *inactive))
        levels.append(CgroupLevel(min(limits), used))
    return levels


class ProcessMemoryRoom:
    """Reads this process's memory room; ``read()`` gives one :class:`MemoryRoom`.
    ``proc`` and ``cgroup_root`` stand for ``/proc`` and ``/sys/fs/cgroup``."""

    def __init__(self, proc: Path = Path("/proc"), cgroup_root: Path = SYS_CGROUP) -> None:
        self.proc = proc
        self.place = own_group(
            _read(proc / "self" / "cgroup"), cgroup_root, _read(proc / "self" / "mountinfo")
        )

    def read(self) -> MemoryRoom:
        total, available = parse_meminfo(_read(self.proc / "meminfo"))
        if available is None:
            available = total if total is not None else UNLIMITED
        if self.place is None:
            return MemoryRoom(available, total or 0)
        return MemoryRoom.of(available, total or 0, read_levels(self.place), self.place.path)

    def own_bytes(self) -> int:
        """This process's resident memory (``VmRSS``; 0 where unknown): what a fresh cgroup
        would hold of it before a run loads anything (``python -m bmoe.plan --mem-limit-mb``)."""
        rss_mib = parse_proc_status(_read(self.proc / "self" / "status")).rss_mib
        return max(0, int(rss_mib * MIB))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
