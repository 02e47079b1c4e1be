"""The governor under real memory pressure: a streamed session and a second process that
allocates memory in steps, then frees it, both in one memory cgroup. The session's governor
(reading its own cgroup through ``MemoryProbe``) shrinks the cache before the limit is hit,
nobody is OOM-killed, the text equals an unpressured run's, and the budget grows back once the
other process has freed its memory. Bounded: the allocator stops by itself after a few
seconds, the session after the allocator is done or 120 s. Skipped where no memory cgroup can
be made. The two processes are ``python -m bmoe.bench.pressure session|hog``;
``tools/governor_cycles.py`` runs the same for 20 cycles and charts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe.bench.cgroup import CgroupError, MemoryGroup, machine_sites
from bmoe.bench.pressure import pressure_shape
from bmoe.tinymodel.synthetic import write_synthetic

MIB = 1024 * 1024
LIMIT_MIB = 1536
CACHE_MIB = 400
PRESSURE = [sys.executable, "-m", "bmoe.bench.pressure"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(
        tmp_path_factory.mktemp("pressure") / "model.gguf", pressure_shape(), 0, progress=False
    )


def _run(
    model: Path, signals: Path, *, governed: bool, group: MemoryGroup | None, turns: int = 0
) -> tuple[list[dict], int]:
    signals.mkdir()
    session = subprocess.Popen(
        [*PRESSURE, "session", str(model), str(signals), f"--turns={turns}", f"--cache-mib={CACHE_MIB}",
         *(["--governed"] if governed else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    hog = None
    if group is not None:
        hog = subprocess.Popen(
            [*PRESSURE, "hog", str(signals), "--cycles=1"], stdin=subprocess.PIPE, text=True
        )
        group.add(session.pid)
        group.add(hog.pid)
        assert hog.stdin is not None
        hog.stdin.write("go\n")
        hog.stdin.close()
    out, err = session.communicate("go\n", timeout=300)
    hog_rc = hog.wait(timeout=120) if hog is not None else 0
    assert session.returncode == 0, f"session exit {session.returncode}: {err[-2000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], hog_rc


def test_the_governor_yields_to_another_process_and_takes_the_memory_back(
    model: Path, tmp_path: Path
) -> None:
    try:
        group = MemoryGroup.create(machine_sites(), f"bmoe-pressure-{os.getpid()}", LIMIT_MIB * MIB)
    except CgroupError as exc:
        pytest.skip(f"no memory cgroup here: {exc}")
    try:
        lines, hog_rc = _run(model, tmp_path / "pressed", governed=True, group=group)
        oom_kills = group.oom_kills()
    finally:
        group.close()
    assert oom_kills == 0 and hog_rc == 0
    turns = [line for line in lines if "tokens" in line]
    [changes] = [[c[1:] for c in line["changes"]] for line in lines if "changes" in line]
    baseline, _ = _run(model, tmp_path / "calm", governed=False, group=None, turns=len(turns))
    assert [t["tokens"] for t in turns] == [b["tokens"] for b in baseline]  # exact under pressure
    shrinks = [c for c in changes if c[1] < c[0]]
    grows = [c for c in changes if c[1] > c[0]]
    print("governor changes:", *changes, sep="\n  ")
    assert shrinks, changes  # it yielded while the other process held memory
    assert grows and changes.index(grows[-1]) > changes.index(shrinks[-1]), changes  # and took it back
    assert min(t["budget"] for t in turns) < CACHE_MIB * MIB
