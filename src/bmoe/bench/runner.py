"""The parent's side of one configuration: a fresh process, the page cache dropped, the
memory group and the disk throttle, the progress lines, the figures; and the disk probe,
run in a process of its own inside the same groups."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bmoe.bench.child import PROGRESS_TAG, RESULT_TAG
from bmoe.bench.disk import Bandwidth, drop_from_page_cache
from bmoe.bench.io_group import Confinement


def run_configuration(
    spec: dict[str, Any],
    *,
    model: Path,
    make_group: Callable[[], Confinement] | None,
    timeout_s: float,
    on_progress: Callable[[int], None],
) -> dict[str, Any]:
    """Run ``spec`` in ``python -m bmoe.bench --child``; its figures, with ``error`` set
    when it failed (exit status, OOM kill in the group, timeout) and ``group`` (the memory
    group's peak and OOM kills) when it ran in one."""
    drop_from_page_cache(model)
    group = make_group() if make_group is not None else None
    result: dict[str, Any] = {"key": spec["key"]}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bmoe.bench", "--child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            if group is not None:
                group.add(proc.pid)  # before the child reads its spec: nothing loaded yet
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.close()
            for line in proc.stdout:
                if line.startswith(PROGRESS_TAG):
                    on_progress(int(line[len(PROGRESS_TAG) :]))
                elif line.startswith(RESULT_TAG):
                    result = json.loads(line[len(RESULT_TAG) :])
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if group is not None:
                if group.io is not None:  # what the process read from the throttled disk
                    result["disk_read_bytes"] = group.io.read_bytes()
                if group.memory is not None:
                    memory = group.memory
                    result["group"] = {"peak_bytes": memory.peak_bytes(), "oom_kills": memory.oom_kills()}
                group.close()
        if proc.returncode != 0 or "tok_s" not in result:
            why = f"exit status {proc.returncode}"
            if timed_out.is_set():
                why = f"timed out after {timeout_s:g} s"
            elif result.get("group", {}).get("oom_kills"):
                why += " (OOM-killed in the memory group)"
            err.seek(0)
            tail = err.read().strip().splitlines()[-3:]
            result["error"] = why + (": " + " / ".join(tail) if tail else "")
    result["process_s"] = time.perf_counter() - t0
    return result


def probe_disk(
    model: Path,
    kind: str,
    mib: int,
    lanes: int,
    *,
    seed: int = 0,
    make_group: Callable[[], Confinement] | None,
) -> Bandwidth:
    """The disk's ``O_DIRECT`` bandwidth on ``model`` (``kind`` ``sequential``: the first
    ``mib`` MiB, 0 the whole file; ``random``: ``mib`` MiB of 2 MiB blocks at random places),
    read by ``python -m bmoe.bench.disk`` inside the groups ``make_group`` makes (the disk
    throttle), as a configuration's process would read it."""
    group = make_group() if make_group is not None else None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bmoe.bench.disk", str(model), kind, str(mib), str(lanes), str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if group is not None:
            group.add(proc.pid)  # before it reads: it waits for the line below
        out, _ = proc.communicate("go\n")
        if proc.returncode != 0:
            raise RuntimeError(f"the disk probe failed (exit status {proc.returncode})")
        return Bandwidth(**json.loads(out))
    finally:
        if group is not None:
            group.close()
