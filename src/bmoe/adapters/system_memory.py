"""How much memory this process may still use: MemAvailable, capped by a cgroup limit."""

from __future__ import annotations

from pathlib import Path

UNLIMITED = 1 << 60


def read_cgroup_int(path: Path) -> int | None:
    """A cgroup file's number (``max``: ``UNLIMITED``); None where it cannot be read."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """``(MemTotal, MemAvailable)`` in bytes, from the text of ``/proc/meminfo``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
            values[key] = int(fields[0]) * 1024
    return values.get("MemTotal"), values.get("MemAvailable")


def available_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo, lowered to the room left under a cgroup limit
    (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) when one applies."""
    try:
        _, available = parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        available = None
    avail = UNLIMITED if available is None else available
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit = read_cgroup_int(Path(limit_file))
        usage = read_cgroup_int(Path(usage_file))
        if limit is not None and usage is not None and limit < UNLIMITED // 2:
            avail = min(avail, max(0, limit - usage))
    return avail
