"""The memory room from fake /proc and cgroup trees: the process's own group (v1 and v2),
nested groups and their ancestors' limits, ``max``, ``memory.high``, a container's
namespace, a missing controller; and the governor reads the room the auto budget reads."""

from __future__ import annotations

from pathlib import Path

from bmoe.adapters.memory_pressure import MemoryProbe
from bmoe.adapters.memory_room import ProcessMemoryRoom, own_group
from bmoe.domain.memory_room import CgroupLevel, MemoryRoom
from bmoe.domain.streaming import MIB, RunMemory, StreamConfig, resolve_budget

GIB = 1 << 30
FREE = 21957 * MIB  # the machine's MemAvailable in the run
MEMINFO = f"MemTotal:       24000000 kB\nMemAvailable:   {FREE // 1024} kB\n"
V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
V1_UNLIMITED = "9223372036854771712"


def fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


def group(folder: Path, **files: str) -> Path:
    """A cgroup folder with these files (``memory_max`` for ``memory.max``...)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)
    return folder


def v1(folder: Path, limit: int | str, usage: int, inactive: int = 0) -> Path:
    return group(
        folder,
        memory_limit_in_bytes=str(limit),
        memory_usage_in_bytes=str(usage),
        memory_stat=f"cache 0\ntotal_inactive_file {inactive}\n",
    )


def test_a_v1_child_group_of_2_gib_is_the_room_not_the_machines_free_memory(tmp_path: Path) -> None:
    """The issue's run: the hierarchy's root is unlimited, the process's child group has 2 GiB."""
    root = tmp_path / "cgroup"
    v1(root / "memory", V1_UNLIMITED, 30 * GIB)
    v1(root / "memory" / "bench", V1_UNLIMITED, 600 * MIB)
    child = v1(root / "memory" / "bench" / "run1", 2 * GIB, 500 * MIB, inactive=100 * MIB)
    proc = fake_proc(tmp_path, "5:devices:/\n4:memory:/bench/run1\n0::/\n", V1_MOUNTS)
    reader = ProcessMemoryRoom(proc, root)
    assert reader.place is not None
    assert (reader.place.version, reader.place.folder, reader.place.path) == (1, child, "/bench/run1")
    assert reader.place.chain() == [child, root / "memory" / "bench", root / "memory"]
    room = reader.read()
    assert room == MemoryRoom(FREE, 24000000 * 1024, 2 * GIB, 2 * GIB - 400 * MIB, "/bench/run1")
    assert room.room_bytes == 1648 * MIB and room.usable_bytes == 2 * GIB


def test_an_ancestor_with_the_lower_limit_binds(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    v1(root / "memory", V1_UNLIMITED, 30 * GIB)
    v1(root / "memory" / "slice", 3 * GIB, 2 * GIB + 512 * MIB)  # a sibling uses 2 GiB of it
    v1(root / "memory" / "slice" / "app", 8 * GIB, 512 * MIB)
    proc = fake_proc(tmp_path, "4:memory:/slice/app\n", V1_MOUNTS)
    room = ProcessMemoryRoom(proc, root).read()
    assert room.limit_bytes == 3 * GIB  # the smallest limit of the chain
    assert room.room_bytes == 512 * MIB  # the parent's room, not the group's own 7.5 GiB


def test_a_v1_ancestor_that_does_not_count_its_children_limits_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    v1(root / "memory", V1_UNLIMITED, 30 * GIB)
    parent = v1(root / "memory" / "old", GIB, 900 * MIB)
    (parent / "memory.use_hierarchy").write_text("0\n")
    v1(root / "memory" / "old" / "app", 4 * GIB, GIB)
    proc = fake_proc(tmp_path, "4:memory:/old/app\n", V1_MOUNTS)
    assert ProcessMemoryRoom(proc, root).read().room_bytes == 3 * GIB


def test_v2_nested_groups_with_max_and_a_lower_memory_high(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group(root, memory_stat="inactive_file 0\n")  # the real root has no memory.max
    group(root / "user.slice", memory_max=str(6 * GIB), memory_current=str(GIB), memory_stat="")
    app = group(
        root / "user.slice" / "app.scope",
        memory_max="max",
        memory_high=str(4 * GIB),
        memory_current=str(GIB + 256 * MIB),
        memory_stat=f"anon 1\ninactive_file {256 * MIB}\n",
    )
    proc = fake_proc(tmp_path, "0::/user.slice/app.scope\n", V2_MOUNTS)
    reader = ProcessMemoryRoom(proc, root)
    assert reader.place is not None and (reader.place.version, reader.place.folder) == (2, app)
    room = reader.read()
    assert room.limit_bytes == 4 * GIB  # memory.high, below memory.max ("max") and the parent's 6 GiB
    assert room.room_bytes == 3 * GIB  # 4 GiB - (1.25 GiB - 0.25 GiB of inactive file pages)


def test_no_limit_anywhere_leaves_the_machines_figure(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group(root / "app", memory_max="max", memory_high="max", memory_current=str(GIB))
    proc = fake_proc(tmp_path, "0::/app\n", V2_MOUNTS)
    room = ProcessMemoryRoom(proc, root).read()
    assert (room.room_bytes, room.limit_bytes, room.usable_bytes) == (FREE, None, 24000000 * 1024)
    v1(root / "memory" / "x", V1_UNLIMITED, GIB)
    proc = fake_proc(tmp_path / "v1", "4:memory:/x\n", V1_MOUNTS)
    assert ProcessMemoryRoom(proc, root).read().room_bytes == FREE


def test_a_containers_namespace_reads_the_mount_as_its_own_group(tmp_path: Path) -> None:
    # v2 with a cgroup namespace: /proc/self/cgroup says "/", the mount is the group itself
    root = tmp_path / "v2"
    group(root, memory_max=str(2 * GIB), memory_current=str(GIB), memory_stat="")
    proc = fake_proc(tmp_path / "a", "0::/\n", V2_MOUNTS)
    reader = ProcessMemoryRoom(proc, root)
    assert reader.place is not None and reader.place.chain() == [root]
    assert reader.read().room_bytes == GIB
    # v1 without a namespace: the mount's root (field 4) is the container's group
    root = tmp_path / "v1"
    v1(root / "memory", 2 * GIB, GIB + GIB // 2)
    mountinfo = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
    proc = fake_proc(tmp_path / "b", "4:memory:/docker/abc\n", mountinfo)
    reader = ProcessMemoryRoom(proc, root)
    assert reader.place is not None and reader.place.folder == root / "memory"
    assert reader.read().room_bytes == GIB // 2
    # a group below the container's: found under the mount
    v1(root / "memory" / "job", GIB, GIB // 4)
    proc = fake_proc(tmp_path / "c", "4:memory:/docker/abc/job\n", mountinfo)
    assert ProcessMemoryRoom(proc, root).read().room_bytes == GIB // 2  # the container's is lower


def test_a_missing_controller_leaves_the_machines_figure(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    group(root / "app", memory_current=str(GIB))  # v2 without the memory controller: no memory.max
    proc = fake_proc(tmp_path, "0::/app\n", V2_MOUNTS)
    assert ProcessMemoryRoom(proc, root).place is None
    assert ProcessMemoryRoom(proc, root).read() == MemoryRoom(FREE, 24000000 * 1024)
    # v1 without a memory mount, and no /proc/self/cgroup at all
    assert own_group("4:memory:/app\n", root, V1_MOUNTS.replace("rw,memory", "rw,cpuset")) is None
    assert own_group("", root, V1_MOUNTS) is None
    assert ProcessMemoryRoom(tmp_path / "nowhere", root).read().room_bytes >= 1 << 59  # nothing known


def test_the_governor_reads_the_room_the_auto_budget_is_set_from(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    v1(root / "memory" / "slice", 3 * GIB, GIB)
    v1(root / "memory" / "slice" / "app", 2 * GIB, 700 * MIB, inactive=200 * MIB)
    proc = fake_proc(tmp_path, "4:memory:/slice/app\n", V1_MOUNTS)
    governor = MemoryProbe(proc, root).read()
    room = ProcessMemoryRoom(proc, root).read()
    assert governor.room_bytes == room.room_bytes == 2 * GIB - 500 * MIB
    assert governor.usable_bytes == room.usable_bytes == 2 * GIB
    memory = RunMemory(room, dense_bytes=200 * MIB, kv_bytes=384 * MIB, compute_buffer_bytes=87 * MIB)
    budget = resolve_budget(StreamConfig(enabled=True), memory=memory, token_cycle_bytes=MIB)
    assert budget.bytes == (2048 - 500 - 87 - 64) * MIB  # below the group's room, not the machine's


def test_a_levels_room_is_never_negative() -> None:
    assert CgroupLevel(GIB, 2 * GIB).room_bytes == 0
    over = MemoryRoom.of(FREE, 0, [CgroupLevel(GIB, 2 * GIB)])
    assert (over.room_bytes, over.usable_bytes) == (0, GIB)
