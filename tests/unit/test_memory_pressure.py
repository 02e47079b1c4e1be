"""The governor's readings from stand-ins of /proc and the cgroup filesystem: meminfo, PSI,
the process's own memory group (v1 and v2), its usage less reclaimable file pages."""

from __future__ import annotations

from pathlib import Path

from bmoe.adapters.memory_pressure import MemoryProbe, parse_psi_some_avg10
from bmoe.adapters.memory_room import own_group, parse_meminfo, parse_stat_value

GIB = 1 << 30
MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   18000000 kB\n"
PSI = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=4\n"


def test_meminfo_psi_and_stat_are_read() -> None:
    assert parse_meminfo(MEMINFO) == (24000000 * 1024, 18000000 * 1024)
    assert parse_meminfo("") == (None, None)
    assert parse_psi_some_avg10(PSI) == 12.5
    assert parse_psi_some_avg10("") is None
    stat = "cache 100\ntotal_inactive_file 4096\ninactive_file 2048\n"
    assert parse_stat_value(stat, "total_inactive_file", "inactive_file") == 4096
    assert parse_stat_value(stat, "nothing") == 0


def _proc(tmp_path: Path, cgroup: str, mountinfo: str, *, psi: str | None = PSI) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    if psi is not None:
        (proc / "pressure").mkdir()
        (proc / "pressure" / "memory").write_text(psi)
    return proc


V1_MOUNTS = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"


def test_a_v1_group_limits_the_room_by_its_usage_less_inactive_files(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group = root / "memory" / "app" / "x"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(str(2 * GIB))
    (group / "memory.usage_in_bytes").write_text(str(GIB + GIB // 2))
    (group / "memory.stat").write_text(f"total_inactive_file {GIB // 2}\n")
    proc = _proc(tmp_path, "4:memory:/app/x\n0::/\n", V1_MOUNTS)
    probe = MemoryProbe(proc, root)
    assert probe.group is not None and (probe.group.version, probe.group.folder) == (1, group)
    reading = probe.read()
    assert reading.usable_bytes == 2 * GIB  # the limit, below MemTotal
    assert reading.room_bytes == GIB  # 2 GiB - (1.5 GiB used - 0.5 GiB reclaimable)
    assert reading.pressure_pct is None  # v1 has no group PSI, and the machine's is other groups'


def test_a_v1_group_whose_limit_does_not_bind_lets_the_machine_speak(tmp_path: Path) -> None:
    """A loose limit (above what the machine has free): the machine's room binds, and its PSI
    is this process's concern."""
    root = tmp_path / "cgroup"
    group = root / "memory" / "user"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(str(64 * GIB))
    (group / "memory.usage_in_bytes").write_text(str(GIB))
    proc = _proc(tmp_path, "4:memory:/user\n", V1_MOUNTS)
    reading = MemoryProbe(proc, root).read()
    assert reading.room_bytes == 18000000 * 1024 and reading.pressure_pct == 12.5


def test_a_v2_group_gives_its_own_pressure(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group = root / "user.slice" / "app"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(str(4 * GIB))
    (group / "memory.current").write_text(str(GIB))
    (group / "memory.pressure").write_text("some avg10=40.00 avg60=0 avg300=0 total=1\n")
    proc = _proc(tmp_path, "0::/user.slice/app\n", V2_MOUNTS)
    reading = MemoryProbe(proc, root).read()
    assert (reading.usable_bytes, reading.room_bytes, reading.pressure_pct) == (4 * GIB, 3 * GIB, 40.0)


def test_without_a_limit_or_psi_the_machine_speaks(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group = root / "app"
    group.mkdir(parents=True)
    (group / "memory.max").write_text("max")
    (group / "memory.current").write_text(str(GIB))
    proc = _proc(tmp_path, "0::/app\n", V2_MOUNTS, psi=None)
    reading = MemoryProbe(proc, root).read()
    assert reading.usable_bytes == 24000000 * 1024 and reading.room_bytes == 18000000 * 1024
    assert reading.pressure_pct is None
    assert own_group("", root, "") is None


def test_the_groups_limit_hits_count_between_readings_where_its_limit_binds(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group = root / "memory" / "app"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(str(2 * GIB))
    (group / "memory.usage_in_bytes").write_text(str(GIB))
    (group / "memory.failcnt").write_text("10\n")
    probe = MemoryProbe(_proc(tmp_path, "4:memory:/app\n", V1_MOUNTS), root)
    assert probe.read().limit_hits == 0  # the first reading: no earlier count
    (group / "memory.failcnt").write_text("162\n")
    assert probe.read().limit_hits == 152
    assert probe.read().limit_hits == 0


def test_a_v2_groups_limit_hits_are_its_max_events(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group = root / "app"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(str(2 * GIB))
    (group / "memory.current").write_text(str(GIB))
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n")
    probe = MemoryProbe(_proc(tmp_path, "0::/app\n", V2_MOUNTS), root)
    probe.read()
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\n")
    assert probe.read().limit_hits == 4
