"""``LaneExpertSource``: ``IExpertSource`` over the C streamer's read lanes.

Each entry is read by ``ExpertStreamer.read_entry`` (every projection of one expert, with
``pread`` on the model file, ``O_DIRECT`` through the lane's page-aligned bounce buffer, into
the expert memory the graph reads) on a pool of ``lanes`` threads; the read runs without the
GIL, so reads issued ahead proceed while llama.cpp computes. A lane is one bounce buffer:
each read takes a free lane and gives it back.

This is the source of the reference mode (``--stream-policy reference``); the fast path
reads from inside the C callback with the same ``run_job`` code.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all

from bmoe.cext.expert_stream import ExpertStreamer
from bmoe.domain.streaming import Entry, GraphFault, ReadFault, StreamFault
from bmoe.ports.expert_source import IExpertSource


def streamer_fault(
    streamer: ExpertStreamer, paths: Sequence[str], tensor_at: Callable[[int, int], str] | None = None
) -> StreamFault | None:
    """The streamer's sticky fault as a domain value; ``tensor_at(file, offset)`` names the
    tensor a failed read was in."""
    fault = streamer.fault()
    if fault is None:
        return None
    if fault[0] == "read":
        _, index, offset, err = fault
        return ReadFault(str(paths[index]), offset, err, tensor=tensor_at(index, offset) if tensor_at else "")
    if fault[0] == "graph":
        return GraphFault(fault[1], fault[2])
    return GraphFault(fault[1], "the reference streaming policy failed to serve it")


class LaneExpertSource(IExpertSource):
    """Borrows an ``ExpertStreamer`` whose projections are set and files open; ``close()``
    closes it."""

    def __init__(
        self,
        streamer: ExpertStreamer,
        paths: Sequence[str],
        lanes: int,
        tensor_at: Callable[[int, int], str] | None = None,
    ) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        self._streamer = streamer
        self._paths = list(paths)
        self._tensor_at = tensor_at  # names the tensor of a failed read
        self._free_lanes: queue.SimpleQueue[int] = queue.SimpleQueue()
        for lane in range(lanes):
            self._free_lanes.put(lane)
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=lanes, thread_name_prefix="bmoe-lane"
        )
        self._issued: dict[Entry, Future[bool]] = {}

    @property
    def n_layer(self) -> int:
        return int(self._streamer.n_layer)

    @property
    def n_expert(self) -> int:
        return int(self._streamer.n_expert)

    def entry_bytes(self, layer: int) -> int:
        return int(self._streamer.entry_bytes(layer))

    def _read(self, entry: Entry) -> bool:
        lane = self._free_lanes.get()
        try:
            return bool(self._streamer.read_entry(entry[0], entry[1], lane))
        finally:
            self._free_lanes.put(lane)

    def _running_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            raise ValueError("the expert source is closed")
        return self._pool

    def _raise_if_faulted(self) -> None:
        fault = self.fault()
        if fault is not None:
            raise fault.error()

    def load(self, entries: Sequence[Entry]) -> float:
        pool = self._running_pool()
        self._raise_if_faulted()
        t0 = time.perf_counter()
        futures = [self._issued.pop(e) if e in self._issued else pool.submit(self._read, e) for e in entries]
        wait_all(futures)
        waited = time.perf_counter() - t0
        self._raise_if_faulted()
        return waited

    def issue(self, entries: Sequence[Entry]) -> None:
        pool = self._running_pool()
        self._raise_if_faulted()
        for entry in entries:
            if entry not in self._issued:
                self._issued[entry] = pool.submit(self._read, entry)

    def cancel(self, entries: Sequence[Entry]) -> int:
        dropped = 0
        for entry in entries:
            future = self._issued.get(entry)
            if future is not None and future.cancel():
                del self._issued[entry]
                dropped += 1
        return dropped

    def release(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            future = self._issued.pop(entry, None)
            if future is not None:
                wait_all([future])
            self._streamer.release_entry(entry[0], entry[1])

    def fault(self) -> StreamFault | None:
        return streamer_fault(self._streamer, self._paths, self._tensor_at)

    def close(self) -> None:
        if self._pool is not None:
            for future in self._issued.values():
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None
            self._issued.clear()
        self._streamer.close()
