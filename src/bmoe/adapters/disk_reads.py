"""Reading a file from the disk, not the page cache: drop it from the cache, measure
``O_DIRECT`` bandwidth.

The file is dropped from the page cache (``posix_fadvise(DONTNEED)``), then read with
``O_DIRECT`` in 4 MiB blocks, with one read in flight (a plain sequential read, what
``dd iflag=direct bs=4M`` measures) or with as many as the streamer has lanes.
``measure_random_reads`` reads blocks at random offsets instead, the way the streamer reads
experts. ``python -m bmoe.bench`` measures the model file so beside each configuration
(``bmoe.bench.disk``); ``python -m bmoe.plan`` at the model's expert-read size, on the model
file or a scratch file (``measure_scratch``).
"""

from __future__ import annotations

import mmap
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import attrs

MIB = 1024 * 1024
BLOCK = 4 * MIB


@attrs.frozen
class Bandwidth:
    """``bytes`` read in ``seconds`` on ``lanes`` threads; ``odirect`` False where the
    filesystem refused ``O_DIRECT`` (the figure is then a buffered read's)."""

    bytes: int
    seconds: float
    lanes: int
    odirect: bool

    @property
    def mib_s(self) -> float:
        return self.bytes / MIB / self.seconds if self.seconds > 0 else 0.0


def drop_from_page_cache(path: Path) -> None:
    """Write back, then drop the file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open_for_reads(path: Path) -> tuple[int, bool]:
    """An ``O_DIRECT`` descriptor, or a buffered one where the filesystem refuses the flag."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return os.open(path, os.O_RDONLY), False
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        os.preadv(fd, [probe], 0)  # some filesystems accept the flag and refuse the reads
    except OSError:
        os.close(fd)
        return os.open(path, os.O_RDONLY), False
    finally:
        probe.close()
    return fd, True


def _read_offsets(path: Path, offsets: list[int], block: int, limit: int, lane: int, done: list[int]) -> None:
    """Read ``block`` bytes at each offset; count those below ``limit`` in ``done[lane]``."""
    fd, _ = _open_for_reads(path)
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    try:
        for offset in offsets:
            n = os.preadv(fd, [buf], offset)
            if n <= 0:
                break
            done[lane] += min(n, limit - offset)
    finally:
        os.close(fd)
        buf.close()


def _timed_reads(path: Path, lanes: list[list[int]], block: int, limit: int) -> Bandwidth:
    """Drop the file from the page cache, then read each lane's offsets on its own thread."""
    drop_from_page_cache(path)
    fd, odirect = _open_for_reads(path)
    os.close(fd)
    done = [0] * len(lanes)
    threads = [
        threading.Thread(target=_read_offsets, args=(path, offsets, block, limit, lane, done))
        for lane, offsets in enumerate(lanes)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if not odirect:
        drop_from_page_cache(path)
    return Bandwidth(bytes=sum(done), seconds=seconds, lanes=len(lanes), odirect=odirect)


def measure_bandwidth(path: Path, max_bytes: int | None = None, n_lanes: int = 1) -> Bandwidth:
    """Read (the first ``max_bytes`` of) the file in 4 MiB blocks on ``n_lanes`` threads
    (blocks ``lane, lane + n_lanes, ...``), after dropping it from the page cache."""
    size = path.stat().st_size
    limit = size if max_bytes is None else min(size, max_bytes)
    offsets = list(range(0, limit, BLOCK))
    return _timed_reads(path, [offsets[lane::n_lanes] for lane in range(n_lanes)], BLOCK, limit)


def measure_random_reads(
    path: Path, total_bytes: int, *, block: int = 2 * MIB, n_lanes: int = 4, seed: int = 0
) -> Bandwidth:
    """Read ``total_bytes`` in ``block``-sized reads at random ``block``-aligned offsets of the
    file (distinct, dealt round-robin to ``n_lanes`` threads), after dropping it from the
    page cache."""
    size = path.stat().st_size
    n_blocks = size // block
    count = max(1, min(n_blocks, total_bytes // block))
    offsets = [b * block for b in random.Random(seed).sample(range(n_blocks), count)]
    return _timed_reads(path, [offsets[lane::n_lanes] for lane in range(n_lanes)], block, size)


def measure_scratch(folder: Path, *, block: int, total_bytes: int = 64 * MIB, n_lanes: int = 4) -> Bandwidth:
    """``O_DIRECT`` random reads of ``block`` bytes on a scratch file of ``total_bytes`` written
    in ``folder`` (the disk a model would be downloaded to), removed afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".bmoe-disk-", dir=folder)
    path = Path(name)
    try:
        chunk = os.urandom(4 * MIB)
        for _ in range(max(1, total_bytes // len(chunk))):
            os.write(fd, chunk)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        return measure_random_reads(path, total_bytes, block=block, n_lanes=n_lanes)
    finally:
        if fd >= 0:
            os.close(fd)
        path.unlink(missing_ok=True)
