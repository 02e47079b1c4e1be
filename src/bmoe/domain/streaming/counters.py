"""The figures a streaming run reports: cumulative counters and per-generate reports."""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.config import MIB


@attrs.frozen
class StreamCounters:
    """Cumulative counters of the streaming mechanism (a snapshot)."""

    requests: int = 0  # MoE layer calls served (one per layer per ubatch)
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0
    bytes_read: int = 0
    io_s: float = 0.0  # the read lanes' busy time (summed over lanes)
    mgmt_s: float = 0.0
    resident_bytes: int = 0
    budget_bytes: int = 0
    stall_s: float = 0.0  # time the compute waited for reads
    prefetch_issued: int = 0
    prefetch_hits: int = 0
    prefetch_wasted: int = 0

    def __sub__(self, before: StreamCounters) -> StreamCounters:
        """The activity between two snapshots (sizes are those of the later one)."""
        return StreamCounters(
            requests=self.requests - before.requests,
            hits=self.hits - before.hits,
            misses=self.misses - before.misses,
            evictions=self.evictions - before.evictions,
            rereads=self.rereads - before.rereads,
            bytes_read=self.bytes_read - before.bytes_read,
            io_s=self.io_s - before.io_s,
            mgmt_s=self.mgmt_s - before.mgmt_s,
            resident_bytes=self.resident_bytes,
            budget_bytes=self.budget_bytes,
            stall_s=self.stall_s - before.stall_s,
            prefetch_issued=self.prefetch_issued - before.prefetch_issued,
            prefetch_hits=self.prefetch_hits - before.prefetch_hits,
            prefetch_wasted=self.prefetch_wasted - before.prefetch_wasted,
        )

    @property
    def hit_pct(self) -> float:
        """Hit rate in percent; -1 when there was no request."""
        total = self.hits + self.misses
        return 100.0 * self.hits / total if total else -1.0

    @property
    def read_mib(self) -> float:
        return self.bytes_read / MIB


@attrs.frozen
class StreamReport:
    """What streaming did during one generate (the ``BMOE_DONE`` streaming keys)."""

    prefill: StreamCounters
    decode: StreamCounters
    decode_steps: int  # decode steps the decode counters cover
    decode_wall_s: float

    def per_token(self, seconds: float) -> float:
        return seconds / self.decode_steps if self.decode_steps > 0 else 0.0

    @property
    def io_s_tok(self) -> float:
        return self.per_token(self.decode.io_s)

    @property
    def stall_s_tok(self) -> float:
        return self.per_token(self.decode.stall_s)

    @property
    def mgmt_s_tok(self) -> float:
        return self.per_token(self.decode.mgmt_s)

    @property
    def compute_s_tok(self) -> float:
        """Wall time not spent waiting for reads nor managing the cache."""
        return max(0.0, self.per_token(self.decode_wall_s) - self.stall_s_tok - self.mgmt_s_tok)

    @property
    def read_mib_tok(self) -> float:
        return self.decode.read_mib / self.decode_steps if self.decode_steps > 0 else 0.0
