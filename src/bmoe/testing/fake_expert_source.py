"""``FakeExpertSource``: an ``IExpertSource`` over bytes in memory, for policy tests.

The "file" holds a deterministic pattern per entry; ``memory`` is what the compute graph
would read (absent entries read as zeros: ``read_back`` returns zeros for them). Reads take
scripted time on a virtual clock (no sleeping): a demand ``load`` costs the latency of every
read it had to do or finish; reads ``issue``d ahead run on ``lanes`` virtual lanes while the
caller ``advance``s the clock (compute), so a policy that reads ahead can be seen to wait
less. Faults are injected per entry or per read count:

- ``fail_entry(entry, errno)``: the read of that entry fails (``EIO`` by default);
- ``short_read(entry)``: the file ends inside that entry (a truncated file);
- ``eintr_storm(n)``: the next ``n`` read attempts are interrupted and retried (never a fault);
- ``replace_file()``: the file was replaced under the session: the next read faults.
"""

from __future__ import annotations

import errno as errno_codes
from collections import OrderedDict
from collections.abc import Callable, Sequence

from bmoe.domain.streaming import Entry, ReadFault, StreamFault
from bmoe.ports.expert_source import IExpertSource

Latency = Callable[[Entry], float]


class FakeExpertSource(IExpertSource):
    def __init__(
        self,
        entry_bytes: Sequence[int],
        n_expert: int,
        *,
        latency: Latency | float = 0.001,
        lanes: int = 2,
        path: str = "fake.gguf",
    ) -> None:
        self._entry_bytes = tuple(entry_bytes)
        self._n_expert = n_expert
        fixed = float(latency) if not callable(latency) else 0.0
        self._latency: Latency = latency if callable(latency) else (lambda _entry: fixed)
        self.lanes = lanes
        self.path = path
        self.memory: dict[Entry, bytes] = {}
        self.clock = 0.0  # virtual seconds
        self.reads: list[Entry] = []  # every read done, in order (a read twice shows twice)
        self._issued: OrderedDict[Entry, float] = OrderedDict()  # entry -> seconds left
        self._failing: dict[Entry, int] = {}
        self._short: set[Entry] = set()
        self._eintr = 0
        self.eintr_retries = 0
        self._replaced = False
        self._fault: ReadFault | None = None
        self._closed = False

    # -- scripting ---------------------------------------------------------------------------

    def fail_entry(self, entry: Entry, err: int = errno_codes.EIO) -> None:
        self._failing[entry] = err

    def short_read(self, entry: Entry) -> None:
        self._short.add(entry)

    def eintr_storm(self, n: int) -> None:
        self._eintr += n

    def replace_file(self) -> None:
        self._replaced = True

    def file_bytes(self, entry: Entry) -> bytes:
        """The entry's bytes in the "file" (a pattern that differs per entry)."""
        layer, expert = entry
        seed = (layer * 131 + expert * 7 + 1) % 251
        return bytes((seed + i) % 256 for i in range(self._entry_bytes[layer]))

    def read_back(self, entry: Entry) -> bytes:
        """What the compute graph would read for ``entry``: zeros unless loaded."""
        return self.memory.get(entry, bytes(self._entry_bytes[entry[0]]))

    def offset(self, entry: Entry) -> int:
        layer, expert = entry
        return sum(self._entry_bytes[:layer]) * self._n_expert + expert * self._entry_bytes[layer]

    # -- the clock ---------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of compute pass: issued reads progress on the idle lanes."""
        self.clock += seconds
        budget = [seconds] * self.lanes
        for entry in list(self._issued):
            lane = max(range(self.lanes), key=lambda i: budget[i])
            if budget[lane] <= 0:
                break
            left = self._issued[entry]
            done = min(left, budget[lane])
            budget[lane] -= done
            self._issued[entry] = left - done
            if self._issued[entry] <= 0:
                del self._issued[entry]
                self._read(entry)

    def in_flight(self) -> list[Entry]:
        return list(self._issued)

    # -- IExpertSource -----------------------------------------------------------------------

    @property
    def n_layer(self) -> int:
        return len(self._entry_bytes)

    @property
    def n_expert(self) -> int:
        return self._n_expert

    def entry_bytes(self, layer: int) -> int:
        return self._entry_bytes[layer] if 0 <= layer < len(self._entry_bytes) else 0

    def load(self, entries: Sequence[Entry]) -> float:
        self._check_open()
        self._raise_if_faulted()
        waited = 0.0
        for entry in entries:
            left = self._issued.pop(entry, None)
            waited += self._latency(entry) if left is None else left
            self._read(entry)
            self._raise_if_faulted()
        self.clock += waited
        return waited

    def issue(self, entries: Sequence[Entry]) -> None:
        self._check_open()
        self._raise_if_faulted()
        for entry in entries:
            if entry not in self._issued:
                self._issued[entry] = self._latency(entry)

    def cancel(self, entries: Sequence[Entry]) -> int:
        dropped = 0
        for entry in entries:
            if entry in self._issued and self._issued[entry] == self._latency(entry):  # not started
                del self._issued[entry]
                dropped += 1
        return dropped

    def release(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            if entry in self._issued:
                self.clock += self._issued.pop(entry)
                self._read(entry)
            self.memory.pop(entry, None)

    def fault(self) -> StreamFault | None:
        return self._fault

    def close(self) -> None:
        self._issued.clear()
        self._closed = True

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the expert source is closed")

    def _raise_if_faulted(self) -> None:
        if self._fault is not None:
            raise self._fault.error()

    def _read(self, entry: Entry) -> None:
        if self._fault is not None:
            return
        while self._eintr > 0:  # interrupted reads are retried, as pread's caller does
            self._eintr -= 1
            self.eintr_retries += 1
        self.reads.append(entry)
        err = 0
        if self._replaced:
            err = errno_codes.ESTALE
        elif entry in self._failing:
            err = self._failing[entry]
        elif entry in self._short:
            err = errno_codes.EIO
        if err:
            self._fault = ReadFault(self.path, self.offset(entry), err)
            return
        self.memory[entry] = self.file_bytes(entry)
