"""The groups each configuration's process runs in: what makes them (a memory group of
``--mem-limit-mb`` and a disk throttle of ``--disk-mib-s``/``--disk-iops``,
:func:`confinement_factory`), and whether the throttle took (:func:`throttle_warnings`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from bmoe.bench.cgroup import CgroupError, MemoryGroup, machine_sites
from bmoe.bench.disk import MIB, Bandwidth
from bmoe.bench.io_group import Confinement, DiskThrottle, IoGroup, block_device_of


def confinement_factory(
    model: Path, mem_limit_mb: int, throttle: DiskThrottle
) -> Callable[[], Confinement] | None:
    """What makes one process's groups: a memory group of ``mem_limit_mb`` MiB and/or a
    disk throttle on the model's disk; None when neither is asked for. ``CgroupError``
    now where the model is on no block device; a group that cannot be made refuses when
    first made."""
    if not mem_limit_mb and not throttle.active:
        return None
    device = block_device_of(model) if throttle.active else None
    memory_sites = machine_sites()
    io_sites = machine_sites("blkio")
    name = f"bmoe-bench-{os.getpid()}"

    def make() -> Confinement:
        groups = Confinement()
        try:
            if mem_limit_mb:
                groups.memory = MemoryGroup.create(memory_sites, name, mem_limit_mb * MIB)
            if device is not None:
                groups.io = IoGroup.create(io_sites, name + "-io", device, throttle, inside=groups.memory)
        except CgroupError:
            groups.close()
            raise
        return groups

    return make


def throttle_warnings(throttle: DiskThrottle, measured: Sequence[Bandwidth]) -> list[str]:
    """Where a probe inside the throttle read faster than it (by more than 10%): the
    throttle did not take, and the ceiling the report uses is not the disk's."""
    if not throttle.mib_s:
        return []
    return [
        f"the disk probe read {bw.mib_s:,.0f} MiB/s on {bw.lanes} lane(s) inside a throttle of "
        f"{throttle.mib_s:,} MiB/s: the throttle did not take (another device? a buffered filesystem?)"
        for bw in measured
        if bw.mib_s > 1.1 * throttle.mib_s
    ]
