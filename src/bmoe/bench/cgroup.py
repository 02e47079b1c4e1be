"""A memory cgroup the bench creates, puts one configuration's process in, and removes.

Whichever the machine has: cgroup v2 (``memory.max``, ``memory.peak``, ``memory.events``)
or v1 (``memory.limit_in_bytes``, ``memory.max_usage_in_bytes``, ``memory.oom_control``).
The group is made inside this process's own memory group, so it stays under whatever
accounting the bench itself runs in. The page cache a process fills is charged to its
group: a limit smaller than the model makes "a machine with less RAM than the model".

``candidate_sites`` is pure (it reads the text of ``/proc/self/mounts`` and
``/proc/self/cgroup``); ``MemoryGroup.create`` touches the filesystem.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import attrs


class CgroupError(RuntimeError):
    """No memory cgroup could be created (the message says where it looked and why)."""


@attrs.frozen
class CgroupSite:
    """Where a group can be made: the cgroup ``version`` (1 or 2) and the parent folder."""

    version: int
    parent: Path


def _own_path(proc_cgroup: str, controller: str | None) -> str | None:
    """This process's path in the v2 hierarchy (``controller`` None) or in the v1 hierarchy
    holding ``controller``."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if controller is None and hid == "0" and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def candidate_sites(mounts: str, proc_cgroup: str, v1_controller: str = "memory") -> list[CgroupSite]:
    """Where to try, in order: v2 first (if mounted), then v1's hierarchy holding
    ``v1_controller`` (``memory``; ``blkio`` for a disk throttle)."""
    v2: list[CgroupSite] = []
    v1: list[CgroupSite] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            own = _own_path(proc_cgroup, None)
            if own is not None:
                v2.append(CgroupSite(2, Path(mountpoint) / own.lstrip("/")))
        elif fstype == "cgroup" and v1_controller in options:
            own = _own_path(proc_cgroup, v1_controller)
            if own is not None:
                v1.append(CgroupSite(1, Path(mountpoint) / own.lstrip("/")))
    return v2 + v1


_FILES = {
    # version: (limit file, peak file, file with the OOM-kill count, its key)
    1: ("memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control", "oom_kill"),
    2: ("memory.max", "memory.peak", "memory.events", "oom_kill"),
}


class MemoryGroup:
    """One memory group with a hard limit; ``close`` removes it (a context manager)."""

    def __init__(self, site: CgroupSite, path: Path, limit_bytes: int) -> None:
        self.site = site
        self.path = path
        self.limit_bytes = limit_bytes

    @classmethod
    def create(cls, sites: list[CgroupSite], name: str, limit_bytes: int) -> MemoryGroup:
        """Make the group at the first site that allows it; ``CgroupError`` listing every
        site tried and why it refused when none does."""
        if not sites:
            raise CgroupError(
                "--mem-limit-mb needs a memory cgroup, and this machine mounts none "
                "(no cgroup2 mount, no cgroup v1 'memory' hierarchy in /proc/self/mounts)"
            )
        why: list[str] = []
        for site in sites:
            limit_file = _FILES[site.version][0]
            if site.version == 2:
                controllers = read_or_empty(site.parent / "cgroup.subtree_control")
                if "memory" not in controllers.split():
                    why.append(
                        f"v2 at {site.parent}: the memory controller is not enabled for child groups "
                        "(cgroup.subtree_control)"
                    )
                    continue
            path = site.parent / name
            try:
                path.mkdir()
            except OSError as exc:
                why.append(f"v{site.version} at {site.parent}: cannot create a group ({exc.strerror})")
                continue
            try:
                (path / limit_file).write_text(str(limit_bytes))
                if site.version == 2:
                    with contextlib.suppress(OSError):  # no swap accounting: nothing to turn off
                        (path / "memory.swap.max").write_text("0")
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.rmdir()
                why.append(f"v{site.version} at {site.parent}: cannot set {limit_file} ({exc.strerror})")
                continue
            return cls(site, path, limit_bytes)
        raise CgroupError(
            "--mem-limit-mb: no memory cgroup is writable here; tried "
            + "; ".join(why)
            + ". Run as root, or in a cgroup delegated to this user."
        )

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def peak_bytes(self) -> int | None:
        """The group's peak memory use (page cache included), None where the kernel has no
        such file (cgroup v2 before Linux 5.19)."""
        text = read_or_empty(self.path / _FILES[self.site.version][1]).strip()
        return int(text) if text.isdigit() else None

    def usage_bytes(self) -> int | None:
        """The group's memory use now (page cache included), None where it cannot be read."""
        name = "memory.usage_in_bytes" if self.site.version == 1 else "memory.current"
        text = read_or_empty(self.path / name).strip()
        return int(text) if text.isdigit() else None

    def oom_kills(self) -> int:
        _, _, events, key = _FILES[self.site.version]
        for line in read_or_empty(self.path / events).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1])
        return 0

    def close(self, attempts: int = 50) -> bool:
        """Remove the group (waits up to ``attempts`` x 0.1 s for its processes to leave)."""
        return remove_group(self.path, attempts)

    def __enter__(self) -> MemoryGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_group(path: Path, attempts: int = 50) -> bool:
    """Remove a group's folder, waiting up to ``attempts`` x 0.1 s for its processes to leave;
    True when it is gone."""
    for _ in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    return False


def read_or_empty(path: Path) -> str:
    """A cgroup file's text, "" where it cannot be read (absent on this kernel, no access)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def machine_sites(v1_controller: str = "memory") -> list[CgroupSite]:
    """This machine's candidate sites, from ``/proc/self/mounts`` and ``/proc/self/cgroup``."""
    return candidate_sites(
        read_or_empty(Path("/proc/self/mounts")), read_or_empty(Path("/proc/self/cgroup")), v1_controller
    )
