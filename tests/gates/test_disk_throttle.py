"""The bench's disk throttle on this machine's own cgroups: a process put in the group reads
its disk through it (the group counts the reads), and ``python -m bmoe.bench --disk-mib-s``
runs a configuration under it and takes the throttle as its disk ceiling. Skipped where no
I/O group can be made (not root, no blkio or io controller, a temporary folder on no disk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bmoe.bench.cgroup import CgroupError, machine_sites
from bmoe.bench.io_group import DiskThrottle, IoGroup, block_device_of

MIB = 1024 * 1024


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(16 * MIB))
    return path


@pytest.fixture
def io_group(data_file: Path) -> Iterator[IoGroup]:
    try:
        group = IoGroup.create(
            machine_sites("blkio"), f"bmoe-test-{os.getpid()}", block_device_of(data_file), DiskThrottle(400)
        )
    except (CgroupError, OSError) as exc:
        pytest.skip(f"no I/O cgroup here: {exc}")
    yield group
    group.close()


def test_a_process_in_the_group_reads_its_disk_through_the_throttle(
    data_file: Path, io_group: IoGroup
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bmoe.bench.disk", str(data_file), "sequential", "0", "1", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    io_group.add(proc.pid)
    out, _ = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0
    read = json.loads(out)
    assert read["bytes"] == 16 * MIB
    if not read["odirect"]:
        pytest.skip("the temporary folder's filesystem refused O_DIRECT: its reads may never reach the disk")
    assert io_group.read_bytes() >= 16 * MIB  # the disk reads were the group's, so throttled


def test_the_bench_runs_under_a_disk_throttle_and_takes_it_as_its_ceiling(
    tiny_model_path: Callable[..., Path], tmp_path: Path, io_group: IoGroup
) -> None:
    model = tiny_model_path("qwen3moe")
    try:
        block_device_of(model)
    except CgroupError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "bmoe.bench", "-m", str(model), "--configs", "stream", "--budgets", "25%",
        "--disk-mib-s", "300", "--prompt-tokens", "0", "--warmup", "2", "--tokens", "6", "--rounds", "1",
        "--no-chart", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    assert result["disk_throttle"] == {"mib_s": 300, "iops": 0}
    [stream] = result["summaries"]
    assert stream["ceiling_tok_s"] == pytest.approx(300 / stream["mib_per_tok"])
    [run] = result["runs"][stream["key"]]
    assert run["disk_read_bytes"] > 0  # the configuration's reads were the throttled group's
    assert "throttled by an I/O cgroup to 300 MiB/s" in (out / "bench.md").read_text()
