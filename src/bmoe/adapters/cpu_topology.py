"""The machine's physical cores, from Linux's CPU topology in sysfs (``thread_siblings_list``
of each CPU this process may run on); the rule is ``bmoe.domain.threads``."""

from __future__ import annotations

import os
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
