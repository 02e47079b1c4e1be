"""A disk of known speed: an I/O cgroup that throttles reads of the model's block device.

This VM's disk sits on a host whose page cache ``O_DIRECT`` does not bypass, so its speed
moves 2x within minutes; a phone's flash is a fixed budget. A read throttle on the block
device that holds the model gives every configuration the same budget whatever the host
caches: reads past the throttle wait, in the kernel, for the group's turn. Both kinds of
reads are held: the streamer's ``O_DIRECT`` reads and stock llama.cpp's page faults.

Whichever the machine has:

- cgroup v1: a group in the ``blkio`` hierarchy, with ``blkio.throttle.read_bps_device``
  and ``blkio.throttle.read_iops_device`` set to ``MAJ:MIN N``;
- cgroup v2: ``io.max`` set to ``MAJ:MIN rbps=N riops=N``, in a group of its own or, when
  the same process is also held to a memory limit, a group nested inside that memory group
  (a v2 process sits in one group; the nested group inherits the memory limit).

``block_device_of`` finds the whole disk under a file (a partition's parent: the kernel
throttles disks); a file on no block device (tmpfs, overlay, a network filesystem) is
refused, saying so.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import attrs

from bmoe.bench.cgroup import CgroupError, CgroupSite, MemoryGroup, read_or_empty, remove_group

MIB = 1024 * 1024


@attrs.frozen
class DiskThrottle:
    """Reads of one device held to ``mib_s`` MiB/s and/or ``iops`` reads a second (0: that
    one is not limited)."""

    mib_s: int = 0
    iops: int = 0

    def __attrs_post_init__(self) -> None:
        if self.mib_s < 0 or self.iops < 0:
            raise ValueError(
                f"a disk throttle must be >= 0 (--disk-mib-s {self.mib_s}, --disk-iops {self.iops})"
            )

    @property
    def active(self) -> bool:
        return self.mib_s > 0 or self.iops > 0

    def v1_files(self, device: BlockDevice) -> dict[str, str]:
        """The v1 blkio files and the line each takes."""
        files = {}
        if self.mib_s:
            files["blkio.throttle.read_bps_device"] = f"{device.dev} {self.mib_s * MIB}"
        if self.iops:
            files["blkio.throttle.read_iops_device"] = f"{device.dev} {self.iops}"
        return files

    def v2_line(self, device: BlockDevice) -> str:
        """The v2 ``io.max`` line."""
        limits = [f"rbps={self.mib_s * MIB}" if self.mib_s else "", f"riops={self.iops}" if self.iops else ""]
        return " ".join([device.dev, *[x for x in limits if x]])

    def text(self) -> str:
        parts = [f"{self.mib_s:,} MiB/s" if self.mib_s else "", f"{self.iops:,} reads/s" if self.iops else ""]
        return " and ".join(x for x in parts if x)


@attrs.frozen
class BlockDevice:
    """A whole disk: ``major:minor`` and its kernel name (``vda``, ``nvme0n1``)."""

    major: int
    minor: int
    name: str

    @property
    def dev(self) -> str:
        return f"{self.major}:{self.minor}"


def block_device_of(path: Path, sys_root: Path = Path("/sys")) -> BlockDevice:
    """The whole disk holding ``path``; ``CgroupError`` when it is on no block device."""
    st_dev = os.stat(path).st_dev
    major, minor = os.major(st_dev), os.minor(st_dev)
    node = sys_root / "dev" / "block" / f"{major}:{minor}"
    if not node.exists():
        raise CgroupError(
            f"{path} is on device {major}:{minor}, which is no block device (tmpfs, overlay or a "
            "network filesystem?): there is no disk to throttle; put the model on a disk"
        )
    real = node.resolve()
    if (real / "partition").exists():  # a partition: the kernel throttles its disk
        real = real.parent
    text = (real / "dev").read_text().strip()
    whole_major, _, whole_minor = text.partition(":")
    return BlockDevice(int(whole_major), int(whole_minor), real.name)


class IoGroup:
    """One group whose reads of ``device`` are throttled; ``close`` removes it."""

    def __init__(self, path: Path, version: int, device: BlockDevice, throttle: DiskThrottle, nested: bool):
        self.path = path
        self.version = version
        self.device = device
        self.throttle = throttle
        self.nested = nested  # v2, inside a memory group: the process goes here only

    @classmethod
    def create(
        cls,
        sites: list[CgroupSite],
        name: str,
        device: BlockDevice,
        throttle: DiskThrottle,
        inside: MemoryGroup | None = None,
    ) -> IoGroup:
        """Make the group at the first site that allows it (v2 within ``inside`` when that
        memory group is a v2 one); ``CgroupError`` listing every site tried and why it
        refused when none does."""
        if inside is not None and inside.site.version == 2:
            sites = [CgroupSite(2, inside.path)]
            name = "io"
        if not sites:
            raise CgroupError(
                "--disk-mib-s needs an I/O cgroup, and this machine mounts none "
                "(no cgroup2 mount, no cgroup v1 'blkio' hierarchy in /proc/self/mounts)"
            )
        why: list[str] = []
        for site in sites:
            nested = inside is not None and site.parent == inside.path
            if site.version == 2:
                if nested:
                    with contextlib.suppress(OSError):  # refused: said below
                        (site.parent / "cgroup.subtree_control").write_text("+io")
                controllers = read_or_empty(site.parent / "cgroup.subtree_control")
                if "io" not in {c.lstrip("+") for c in controllers.split()}:
                    why.append(
                        f"v2 at {site.parent}: the io controller is not enabled for child groups "
                        "(cgroup.subtree_control)"
                    )
                    continue
            path = site.parent / name
            try:
                path.mkdir()
            except OSError as exc:
                why.append(f"v{site.version} at {site.parent}: cannot create a group ({exc.strerror})")
                continue
            files = throttle.v1_files(device) if site.version == 1 else {"io.max": throttle.v2_line(device)}
            try:
                for file, line in files.items():
                    (path / file).write_text(line)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.rmdir()
                why.append(
                    f"v{site.version} at {site.parent}: cannot throttle {device.name} ({device.dev}) "
                    f"({exc.strerror})"
                )
                continue
            return cls(path, site.version, device, throttle, nested)
        raise CgroupError(
            "--disk-mib-s: no I/O cgroup is writable here; tried "
            + "; ".join(why)
            + ". Run as root, or in a cgroup delegated to this user."
        )

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def read_bytes(self) -> int:
        """Bytes the group's processes read from the device so far (v1
        ``blkio.throttle.io_service_bytes``, v2 ``io.stat``): reads the throttle held."""
        if self.version == 1:
            return parse_v1_read_bytes(
                read_or_empty(self.path / "blkio.throttle.io_service_bytes"), self.device
            )
        return parse_v2_read_bytes(read_or_empty(self.path / "io.stat"), self.device)

    def close(self, attempts: int = 50) -> bool:
        """Remove the group (waits up to ``attempts`` x 0.1 s for its processes to leave)."""
        return remove_group(self.path, attempts)


def parse_v1_read_bytes(text: str, device: BlockDevice) -> int:
    """``MAJ:MIN Read N`` of ``blkio.throttle.io_service_bytes`` (0 when absent)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == device.dev and fields[1] == "Read" and fields[2].isdigit():
            return int(fields[2])
    return 0


def parse_v2_read_bytes(text: str, device: BlockDevice) -> int:
    """``rbytes=N`` of the device's line of ``io.stat`` (0 when absent)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == device.dev:
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "rbytes" and value.isdigit():
                    return int(value)
    return 0


@attrs.define
class Confinement:
    """The groups one configuration's process runs in: a memory limit, a disk throttle,
    either or both. ``add`` puts a process in each (in v2 only in the innermost)."""

    memory: MemoryGroup | None = None
    io: IoGroup | None = None

    def add(self, pid: int) -> None:
        if self.io is not None:
            self.io.add(pid)
        if self.memory is not None and not (self.io is not None and self.io.nested):
            self.memory.add(pid)

    def close(self) -> None:
        if self.io is not None:
            self.io.close()
        if self.memory is not None:
            self.memory.close()

    def __enter__(self) -> Confinement:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
