"""The default compute threads: one per physical core this process may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.adapters import cpu_topology
from bmoe.domain.threads import physical_core_count


def test_smt_siblings_count_once_and_unknown_cpus_count_alone() -> None:
    pairs = [frozenset({0, 4}), frozenset({1, 5}), frozenset({0, 4}), frozenset({1, 5})]
    assert physical_core_count(pairs, 4) == 2
    assert physical_core_count([frozenset({0}), frozenset({1})], 2) == 2
    assert physical_core_count([frozenset({0, 1}), frozenset()], 2) == 2
    assert physical_core_count([], 6) == 6
    assert physical_core_count([], 0) == 1


def test_the_sysfs_topology_is_read_for_the_allowed_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3", 4: "4"}.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(siblings + "\n")
    monkeypatch.setattr(cpu_topology.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cpu_topology.physical_cores(tmp_path) == 2
    monkeypatch.setattr(cpu_topology.os, "sched_getaffinity", lambda pid: {0, 1, 4})
    assert cpu_topology.physical_cores(tmp_path) == 3  # cpu 2 (0's sibling) is not allowed
    monkeypatch.setattr(cpu_topology.os, "sched_getaffinity", lambda pid: {0, 7})
    assert cpu_topology.physical_cores(tmp_path) == 2  # cpu 7: no topology, a core of its own


def test_ranges_in_the_kernels_cpu_list_format() -> None:
    assert cpu_topology._cpu_list("0-3,8\n") == frozenset({0, 1, 2, 3, 8})
    assert cpu_topology._cpu_list("garbage") == frozenset()
