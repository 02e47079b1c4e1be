"""Benchmark (not a test): the disk's random O_DIRECT read bandwidth by request size and by
reads in flight, over a model file (what expert streaming's lanes ask of it).

    python tools/disk_qd.py MODEL.gguf [--mib 768]

Reads ``--mib`` MiB per cell at random page-aligned offsets with N threads (each blocking in
``preadv``, the GIL released), after nothing else: run it on a quiet machine. The guest page
cache is bypassed; a host's is not (a VM's disk may read faster the second time).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import threading
import time
from pathlib import Path

SIZES = (221184, 442368, 884736, 4194304)  # a quarter, half, one bench-model slice; 4 MiB
DEPTHS = (1, 4, 8, 16)


def bandwidth(path: Path, request: int, depth: int, total_mib: int, seed: int) -> float:
    """MiB/s reading ``total_mib`` in ``request``-byte reads, ``depth`` in flight."""
    size = path.stat().st_size
    rnd = random.Random(seed)
    offsets = iter(
        [
            (rnd.randrange(0, size - request - 8192) // 4096) * 4096
            for _ in range(total_mib * 2**20 // request)
        ]
    )
    lock = threading.Lock()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

    def lane() -> None:
        buf = mmap.mmap(-1, request)  # page aligned, as O_DIRECT needs
        while True:
            with lock:
                offset = next(offsets, None)
            if offset is None:
                return
            os.preadv(fd, [buf], offset)

    threads = [threading.Thread(target=lane) for _ in range(depth)]
    t0 = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    return total_mib / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--mib", type=int, default=768, help="MiB read per cell")
    args = p.parse_args()
    print("| request KiB | " + " | ".join(f"{d} in flight" for d in DEPTHS) + " |")
    print("| ---: | " + " | ".join("---:" for _ in DEPTHS) + " |")
    for request in SIZES:
        cells = [f"{bandwidth(args.model, request, d, args.mib, request + d):,.0f}" for d in DEPTHS]
        print(f"| {request // 1024} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
