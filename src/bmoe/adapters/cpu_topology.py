"""The machine's physical cores, from Linux's CPU topology in sysfs (``thread_siblings_list``
of each CPU this process may run on); the rule is ``bmoe.domain.threads``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bmoe.domain.threads import physical_core_count

_SYSFS = Path("/sys/devices/system/cpu")


def _cpu_list(text: str) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8} (the kernel's CPU list format); empty when unreadable."""
    out: set[int] = set()
    try:
        for part in text.strip().split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return frozenset()
    return frozenset(out)


def physical_cores(root: Path = _SYSFS) -> int:
    """Physical cores this process may run on (the default for ``-t``)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    siblings = []
    for cpu in allowed:
        try:
            text = (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            text = ""
        siblings.append(_cpu_list(text) & frozenset(allowed) if text else frozenset())
    return physical_core_count(siblings, len(allowed))


def machine_load() -> tuple[int, float]:
    """The CPUs this process may run on and the 1-minute load average (0 where unknown)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cpus, load


def _busy_jiffies(stat: Path) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of all CPUs from ``/proc/stat``'s first line."""
    try:
        fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def other_cpu_busy(seconds: float = 0.2, stat: Path = Path("/proc/stat")) -> float | None:
    """How many CPUs other processes keep busy, sampled over ``seconds`` while this one
    sleeps (its own CPU time over the sample taken out); ``None`` where unknown."""
    before = _busy_jiffies(stat)
    own0 = sum(os.times()[:2])
    t0 = time.monotonic()
    time.sleep(seconds)
    after = _busy_jiffies(stat)
    own1 = sum(os.times()[:2])
    wall = time.monotonic() - t0
    if before is None or after is None or after[1] <= before[1] or wall <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy_s = (after[0] - before[0]) / hz - (own1 - own0)
    return max(0.0, busy_s / wall)
