"""The parent's side of one configuration: a fresh process, the page cache dropped, the
memory group, the progress lines, the figures."""

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

from bmoe.bench.cgroup import MemoryGroup
from bmoe.bench.child import PROGRESS_TAG, RESULT_TAG
from bmoe.bench.disk import drop_from_page_cache


def run_configuration(
    spec: dict[str, Any],
    *,
    model: Path,
    make_group: Callable[[], MemoryGroup] | None,
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
                result["group"] = {"peak_bytes": group.peak_bytes(), "oom_kills": group.oom_kills()}
                group.close()
        if proc.returncode != 0 or "tok_s" not in result:
            why = f"exit status {proc.returncode}"
            if timed_out.is_set():
                why = f"timed out after {timeout_s:g} s"
            elif group is not None and result.get("group", {}).get("oom_kills"):
                why += " (OOM-killed in the memory group)"
            err.seek(0)
            tail = err.read().strip().splitlines()[-3:]
            result["error"] = why + (": " + " / ".join(tail) if tail else "")
    result["process_s"] = time.perf_counter() - t0
    return result
