"""The page cache and the disk, for the bench: ``bmoe.adapters.disk_reads`` (drop a file from
the cache, measure ``O_DIRECT`` bandwidth) run as a process the bench puts in its groups.

The bandwidth is measured on the model file itself, in the same run as the configurations;
``measure_random_reads`` runs next to each streamed configuration (this VM's disk speed
moves within minutes).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.disk_reads import (
    BLOCK,
    MIB,
    Bandwidth,
    drop_from_page_cache,
    measure_bandwidth,
    measure_random_reads,
)

__all__ = ["BLOCK", "MIB", "Bandwidth", "drop_from_page_cache", "measure_bandwidth", "measure_random_reads"]


def _main(argv: list[str]) -> None:
    """``python -m bmoe.bench.disk PATH sequential|random MIB LANES SEED [BLOCK]``: waits for
    one line on stdin (the parent puts this process in its groups first), then prints the
    :class:`Bandwidth` as JSON (``BLOCK``: the random reads' size in bytes, 2 MiB unsaid). The
    bench measures the disk this way inside its disk throttle."""
    import json
    import sys

    path, kind, mib, lanes, seed = Path(argv[0]), argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    block = int(argv[5]) if len(argv) > 5 else 2 * MIB
    sys.stdin.readline()
    if kind == "sequential":
        bw = measure_bandwidth(path, mib * MIB or None, n_lanes=lanes)
    else:
        bw = measure_random_reads(path, mib * MIB, block=block, n_lanes=lanes, seed=seed)
    print(json.dumps(attrs.asdict(bw)), flush=True)


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
