"""Expert streaming settings, the cache budget rule, and the figures a run reports."""

from __future__ import annotations

import attrs

from bmoe.errors import ConfigError

MIB = 1024 * 1024
AUTO_FLOOR_MIB = 1024  # memory left to the OS, the dense weights' growth, the KV...


@attrs.frozen
class StreamConfig:
    """``--moe-stream`` and its knobs.

    - ``cache_mb``: the expert cache's budget in MiB; None = auto (available memory minus a
      floor, capped by ``cache_ceil_mb``, at least one token cycle); 0 = cache off.
    - ``io_threads``: read lanes. ``odirect``: read with ``O_DIRECT`` (falls back to buffered
      reads, and says so, where the filesystem refuses it).
    """

    enabled: bool = False
    cache_mb: int | None = None
    cache_ceil_mb: int | None = None
    io_threads: int = 4
    odirect: bool = True

    def __attrs_post_init__(self) -> None:
        if self.cache_mb is not None and self.cache_mb < 0:
            raise ConfigError(f"cache_mb must be >= 0 (0 = cache off), not {self.cache_mb}")
        if self.cache_ceil_mb is not None and self.cache_ceil_mb < 0:
            raise ConfigError(f"cache_ceil_mb must be >= 0, not {self.cache_ceil_mb}")
        if self.io_threads < 1:
            raise ConfigError(f"io_threads must be >= 1, not {self.io_threads}")


@attrs.frozen
class Budget:
    bytes: int
    auto: bool
    warning: str | None = None


def resolve_budget(config: StreamConfig, *, available_bytes: int, token_cycle_bytes: int) -> Budget:
    """The cache budget in bytes.

    ``token_cycle_bytes`` (the sum over layers of k expert slices) is the least useful
    cache: below it an LRU hits almost never, so a smaller budget gets a warning (but is
    honoured); ``auto`` never picks less than one cycle.
    """
    if config.cache_mb is not None:
        budget = config.cache_mb * MIB
        warning = None
        if 0 < budget < token_cycle_bytes:
            warning = (
                f"cache {config.cache_mb} MiB is below one token cycle "
                f"({token_cycle_bytes / MIB:.0f} MiB): expect almost no hits"
            )
        return Budget(budget, auto=False, warning=warning)
    budget = max(0, available_bytes - AUTO_FLOOR_MIB * MIB)
    if config.cache_ceil_mb is not None:
        budget = min(budget, config.cache_ceil_mb * MIB)
    return Budget(max(budget, token_cycle_bytes), auto=True)


@attrs.frozen
class StreamCounters:
    """Cumulative counters of the streaming mechanism (a snapshot)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rereads: int = 0
    bytes_read: int = 0
    io_s: float = 0.0
    mgmt_s: float = 0.0
    resident_bytes: int = 0
    budget_bytes: int = 0

    def __sub__(self, before: StreamCounters) -> StreamCounters:
        """The activity between two snapshots (sizes are those of the later one)."""
        return StreamCounters(
            hits=self.hits - before.hits,
            misses=self.misses - before.misses,
            evictions=self.evictions - before.evictions,
            rereads=self.rereads - before.rereads,
            bytes_read=self.bytes_read - before.bytes_read,
            io_s=self.io_s - before.io_s,
            mgmt_s=self.mgmt_s - before.mgmt_s,
            resident_bytes=self.resident_bytes,
            budget_bytes=self.budget_bytes,
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
    def mgmt_s_tok(self) -> float:
        return self.per_token(self.decode.mgmt_s)

    @property
    def compute_s_tok(self) -> float:
        return max(0.0, self.per_token(self.decode_wall_s) - self.io_s_tok - self.mgmt_s_tok)

    @property
    def read_mib_tok(self) -> float:
        return self.decode.read_mib / self.decode_steps if self.decode_steps > 0 else 0.0
