"""What ``/proc`` says about this process and this machine (Linux only)."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

MIB = 1024 * 1024


def status_bytes(pid: int | str = "self") -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of ``/proc/<pid>/status``, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(line.split()[1]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` (``/proc/self/clear_refs``); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def parse_io(text: str) -> dict[str, int]:
    """The fields of ``/proc/<pid>/io`` (``read_bytes``: bytes this process made the kernel
    fetch from storage, page-cache fills of its mmap faults and read-ahead included)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError):
            out[key.strip()] = int(value)
    return out


def read_bytes(pid: int | str = "self") -> int | None:
    """``read_bytes`` of ``/proc/<pid>/io`` (all the process's threads), None where unreadable."""
    try:
        return parse_io(Path(f"/proc/{pid}/io").read_text()).get("read_bytes")
    except OSError:
        return None


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``, all but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user/nice
    return (sum(values) - idle - guest) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def filesystem_of(path: Path) -> str:
    """The mount (device, fstype) holding ``path``."""
    best = ("?", "?", "")
    target = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[2]):
                best = (dev, fstype, mnt)
    return f"{best[0]} ({best[1]}, mounted on {best[2]})"


def machine_facts(model: Path) -> dict[str, object]:
    """CPUs, memory, kernel, versions and the model's filesystem, for the report."""
    try:
        import llama_cpp

        llama_version = str(llama_cpp.__version__)
    except Exception:  # the facts are informative only
        llama_version = "?"
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "mem_total_gib": _meminfo_kib("MemTotal") / MIB,
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_version,
        "filesystem": filesystem_of(model),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
