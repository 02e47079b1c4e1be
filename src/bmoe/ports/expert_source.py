"""``IExpertSource``: the port through which expert bytes arrive.

Policy (what to read, what to evict, when to read ahead) lives in
``bmoe.domain.streaming`` and ``bmoe.service.expert_streaming``. A source only does what
it is told: its unit is an *entry* ``(layer, expert)``, all projections of one expert of one
layer, read from the model file into the memory the compute graph reads that expert from.

Faults are sticky: after the first failed read, ``fault()`` names it and every later
``load`` or ``issue`` raises it again without reading. Entries whose read failed, or that
were released, read as zeros: the caller must never compute with them.

Implemented by ``bmoe.adapters.expert_source.LaneExpertSource`` (``O_DIRECT`` read lanes
into the model's expert memory) and ``bmoe.testing.fake_expert_source.FakeExpertSource``
(bytes in memory, scripted latency, injected faults).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bmoe.domain.streaming import Entry, StreamFault


class IExpertSource(Protocol):
    """Expert bytes of one model, read into memory entry by entry."""

    @property
    def n_layer(self) -> int:
        """Layers of the model (entries exist for those with routed experts). Never fails."""
        ...

    @property
    def n_expert(self) -> int:
        """Routed experts per layer. Never fails."""
        ...

    def entry_bytes(self, layer: int) -> int:
        """Bytes one entry of ``layer`` occupies (0: the layer has no routed experts).
        Never fails."""
        ...

    def load(self, entries: Sequence[Entry]) -> float:
        """Read ``entries`` and return once all are in memory; entries already issued are
        adopted (waited for, not read twice). Returns the seconds spent waiting. Raises
        ``ExpertReadError`` on the first failed read (the source is then faulted) or when it
        is already faulted; what was read stays read, the failed entries read as zeros."""
        ...

    def issue(self, entries: Sequence[Entry]) -> None:
        """Start reading ``entries`` in the background and return at once; a later ``load``
        of one of them waits for that read. Raises ``ExpertReadError`` when faulted (nothing
        issued); a read that fails in the background faults the source."""
        ...

    def cancel(self, entries: Sequence[Entry]) -> int:
        """Drop issued reads of ``entries`` that have not started; returns how many were
        dropped (reads already running finish). Never fails."""
        ...

    def release(self, entries: Sequence[Entry]) -> None:
        """Give back the memory of ``entries``: they read as zeros until loaded again (an
        issued read of one of them is waited for first). Never fails."""
        ...

    def fault(self) -> StreamFault | None:
        """The first fault (sticky), or None. Never fails."""
        ...

    def close(self) -> None:
        """Wait for reads in flight, then release descriptors and buffers; idempotent.
        Afterwards ``load`` and ``issue`` raise ``ValueError``."""
        ...
