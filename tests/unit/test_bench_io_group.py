"""The bench's disk throttle: which block device, what each cgroup version is told, how a
memory limit and a throttle combine, what is refused and how it is said. Plain folders stand
in for the cgroup filesystem and for /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bmoe.bench.arguments import parser
from bmoe.bench.cgroup import CgroupError, CgroupSite, MemoryGroup, candidate_sites
from bmoe.bench.configs import BenchConfigError
from bmoe.bench.confinement import throttle_warnings
from bmoe.bench.disk import Bandwidth
from bmoe.bench.document import disk_text
from bmoe.bench.io_group import (
    BlockDevice,
    Confinement,
    DiskThrottle,
    IoGroup,
    block_device_of,
    parse_v1_read_bytes,
    parse_v2_read_bytes,
)
from bmoe.bench.run_plan import make_plan

MIB = 1024 * 1024
VDA = BlockDevice(254, 0, "vda")


def test_v1_throttle_writes_bytes_and_reads_a_second_for_the_disk() -> None:
    assert DiskThrottle(500, 0).v1_files(VDA) == {"blkio.throttle.read_bps_device": f"254:0 {500 * MIB}"}
    assert DiskThrottle(0, 2000).v1_files(VDA) == {"blkio.throttle.read_iops_device": "254:0 2000"}
    assert len(DiskThrottle(400, 100).v1_files(VDA)) == 2


def test_v2_throttle_is_one_io_max_line() -> None:
    assert DiskThrottle(400, 0).v2_line(VDA) == f"254:0 rbps={400 * MIB}"
    assert DiskThrottle(400, 100).v2_line(VDA) == f"254:0 rbps={400 * MIB} riops=100"


def test_a_negative_throttle_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        DiskThrottle(-1)
    assert not DiskThrottle().active and DiskThrottle(iops=5).active


def test_the_v1_io_site_is_the_blkio_hierarchy() -> None:
    mounts = (
        "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        "cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0\n"
    )
    own = "7:blkio:/\n4:memory:/process_api/abc\n"
    assert candidate_sites(mounts, own, "blkio") == [CgroupSite(1, Path("/sys/fs/cgroup/blkio"))]
    assert candidate_sites(mounts, own) == [CgroupSite(1, Path("/sys/fs/cgroup/memory/process_api/abc"))]


def _sys_with(tmp_path: Path, dev: str, *, partition_of: str | None = None) -> Path:
    """A /sys stand-in where ``dev`` is a disk, or a partition of the disk ``partition_of``."""
    block = tmp_path / "sys" / "devices" / "virtual" / "block"
    links = tmp_path / "sys" / "dev" / "block"
    links.mkdir(parents=True)
    if partition_of is None:
        disk = block / "vdz"
        disk.mkdir(parents=True)
        (disk / "dev").write_text(dev + "\n")
        (links / dev).symlink_to(disk)
    else:
        disk = block / "sdz"
        part = disk / "sdz1"
        part.mkdir(parents=True)
        (disk / "dev").write_text(partition_of + "\n")
        (part / "dev").write_text(dev + "\n")
        (part / "partition").write_text("1\n")
        (links / dev).symlink_to(part)
    return tmp_path / "sys"


def test_a_file_on_a_disk_is_throttled_on_that_disk(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_root = _sys_with(tmp_path, dev)
    found = block_device_of(tmp_path, sys_root)
    assert (found.dev, found.name) == (dev, "vdz")


def test_a_file_on_a_partition_is_throttled_on_its_whole_disk(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_root = _sys_with(tmp_path, dev, partition_of="8:0")
    found = block_device_of(tmp_path, sys_root)
    assert (found.dev, found.name) == ("8:0", "sdz")


def test_a_file_on_no_block_device_is_refused_saying_why(tmp_path: Path) -> None:
    empty = tmp_path / "sys"
    (empty / "dev" / "block").mkdir(parents=True)
    with pytest.raises(CgroupError, match="no block device"):
        block_device_of(tmp_path, empty)


def test_a_v1_io_group_writes_its_throttle(tmp_path: Path) -> None:
    group = IoGroup.create([CgroupSite(1, tmp_path)], "g-io", VDA, DiskThrottle(500, 0))
    assert (tmp_path / "g-io" / "blkio.throttle.read_bps_device").read_text() == f"254:0 {500 * MIB}"
    assert not group.nested and group.path == tmp_path / "g-io"


def test_a_v1_process_joins_both_the_memory_and_the_io_group(tmp_path: Path) -> None:
    memory_root, io_root = tmp_path / "memory", tmp_path / "blkio"
    memory_root.mkdir()
    io_root.mkdir()
    memory = MemoryGroup.create([CgroupSite(1, memory_root)], "g", 256 * MIB)
    io = IoGroup.create([CgroupSite(1, io_root)], "g-io", VDA, DiskThrottle(400), inside=memory)
    Confinement(memory, io).add(1234)
    assert (memory_root / "g" / "cgroup.procs").read_text() == "1234"
    assert (io_root / "g-io" / "cgroup.procs").read_text() == "1234"


def test_a_v2_io_group_nests_in_the_memory_group_and_holds_the_process(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("memory io\n")
    memory = MemoryGroup.create([CgroupSite(2, tmp_path)], "g", 256 * MIB)
    io = IoGroup.create([CgroupSite(2, tmp_path)], "ignored", VDA, DiskThrottle(400), inside=memory)
    assert io.path == tmp_path / "g" / "io" and io.nested
    assert (tmp_path / "g" / "cgroup.subtree_control").read_text() == "+io"  # asked to enable io below
    assert (io.path / "io.max").read_text() == f"254:0 rbps={400 * MIB}"
    Confinement(memory, io).add(99)
    assert (io.path / "cgroup.procs").read_text() == "99"
    assert not (tmp_path / "g" / "cgroup.procs").exists()  # v2: a process sits in one group


def test_a_v2_site_without_the_io_controller_is_explained(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    with pytest.raises(CgroupError, match="io controller is not enabled"):
        IoGroup.create([CgroupSite(2, tmp_path)], "g", VDA, DiskThrottle(400))
    with pytest.raises(CgroupError, match="mounts none"):
        IoGroup.create([], "g", VDA, DiskThrottle(400))


def test_the_throttle_is_the_ceiling_and_a_probe_above_it_is_said() -> None:
    bw = Bandwidth(bytes=1000 * MIB, seconds=1.0, lanes=4, odirect=True)
    assert throttle_warnings(DiskThrottle(500), [bw]) == [
        "the disk probe read 1,000 MiB/s on 4 lane(s) inside a throttle of 500 MiB/s: the throttle did "
        "not take (another device? a buffered filesystem?)"
    ]
    assert throttle_warnings(DiskThrottle(950), [bw]) == []
    assert throttle_warnings(DiskThrottle(iops=10), [bw]) == []
    assert disk_text(bw, bw, DiskThrottle(500)).startswith("throttled by an I/O cgroup to 500 MiB/s")


def test_negative_disk_flags_are_refused() -> None:
    with pytest.raises(BenchConfigError, match="--disk-mib-s"):
        make_plan(parser().parse_args(["--disk-mib-s", "-5"]))


def test_the_bytes_a_group_read_come_from_its_device_line() -> None:
    v1 = "254:0 Read 4194304\n254:0 Write 0\n8:0 Read 77\nTotal 4194381\n"
    assert parse_v1_read_bytes(v1, VDA) == 4194304
    assert parse_v1_read_bytes("Total 0\n", VDA) == 0
    v2 = "8:0 rbytes=77 wbytes=0\n254:0 rbytes=1048576 wbytes=4096 rios=1 wios=1 dbytes=0 dios=0\n"
    assert parse_v2_read_bytes(v2, VDA) == 1048576
    assert parse_v2_read_bytes("", VDA) == 0
