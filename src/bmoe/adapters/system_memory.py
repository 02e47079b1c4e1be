"""How much memory this process may still use: MemAvailable, capped by a cgroup limit."""

from __future__ import annotations

from pathlib import Path

_UNLIMITED = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def available_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo, lowered to the room left under a cgroup limit
    (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) when one applies."""
    avail = _UNLIMITED
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit = _read_int(Path(limit_file))
        usage = _read_int(Path(usage_file))
        if limit is not None and usage is not None and limit < _UNLIMITED // 2:
            avail = min(avail, max(0, limit - usage))
    return avail
