"""The parent's side of one configuration: a fresh process, the page cache dropped, the
memory group and the disk throttle, the progress lines, the figures; and the disk probe,
run in a process of its own inside the same groups."""

from __future__ import annotations

import json
import signal
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
from bmoe.domain.crash import crash_line_in


def run_configuration(
    spec: dict[str, Any],
    *,
    model: Path,
    make_group: Callable[[], Confinement] | None,
    timeout_s: float,
    on_progress: Callable[[int], None],
    log_path: Path | None = None,
) -> dict[str, Any]:
    """Run ``spec`` in ``python -m bmoe.bench --child``; its figures, with ``error`` set
    when it failed (exit status, a signal, OOM kill in the group, timeout) and ``group``
    (the memory group's peak and OOM kills) when it ran in one. A failed child's whole
    stderr goes to ``log_path`` (when given), which the error names."""
    drop_from_page_cache(model)
    group = make_group() if make_group is not None else None
    result: dict[str, Any] = {"key": spec["key"]}
    answered = False  # the child printed its RESULT line
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
                    answered = True
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
        if proc.returncode != 0 or not answered:
            err.seek(0)
            text = err.read()
            result["error"] = failure_text(
                spec, proc.returncode, text, timed_out=timed_out.is_set(), timeout_s=timeout_s,
                oom=bool(result.get("group", {}).get("oom_kills")), log_path=_saved(log_path, text),
            )  # fmt: skip
            if proc.returncode < 0 and not timed_out.is_set():
                result["crashed"] = signal_name(-proc.returncode)
    result["process_s"] = time.perf_counter() - t0
    return result


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _saved(path: Path | None, text: str) -> Path | None:
    """``text`` written to ``path`` (its folder made); None where it cannot be."""
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        return None
    return path


def failure_text(
    spec: dict[str, Any],
    returncode: int,
    stderr: str,
    *,
    timed_out: bool = False,
    timeout_s: float = 0.0,
    oom: bool = False,
    log_path: Path | None = None,
) -> str:
    """The row's words for a child that failed: ``crashed (SIGSEGV), see LOG`` for a signal
    (with the crash line bmoe printed, or that stock llama.cpp itself crashed), else the
    exit status and the last stderr lines."""
    see = f", see {log_path}" if log_path is not None else ""
    if timed_out:
        return f"timed out after {timeout_s:g} s{see}"
    lines = stderr.strip().splitlines()
    if returncode < 0 and not oom:
        why = f"crashed ({signal_name(-returncode)}){see}"
        if str(spec.get("kind", "")).startswith("stock"):
            return f"{why}: stock llama.cpp itself crashed on this machine"
        line = crash_line_in(lines)
        return f"{why}: {line}" if line else why
    why = f"exit status {returncode}" + (" (OOM-killed in the memory group)" if oom else "")
    tail = lines[-3:]
    return why + see + (": " + " / ".join(tail) if tail else "")


def probe_disk(
    model: Path,
    kind: str,
    mib: int,
    lanes: int,
    *,
    seed: int = 0,
    block: int = 2 * 1024 * 1024,
    make_group: Callable[[], Confinement] | None,
) -> Bandwidth:
    """The disk's ``O_DIRECT`` bandwidth on ``model`` (``kind`` ``sequential``: the first
    ``mib`` MiB, 0 the whole file; ``random``: ``mib`` MiB of ``block``-byte reads at random
    places),
    read by ``python -m bmoe.bench.disk`` inside the groups ``make_group`` makes (the disk
    throttle), as a configuration's process would read it."""
    group = make_group() if make_group is not None else None
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bmoe.bench.disk",
                str(model),
                kind,
                str(mib),
                str(lanes),
                str(seed),
                str(block),
            ],
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
