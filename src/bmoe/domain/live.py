"""What a live view of the engine shows (the server's ``/v1/bmoe/metrics``): pure.

- ``LiveTotals``: one request's running figures, fed a ``Progress`` per token: tokens, the
  decode rate (the first token, sampled from the prefill's logits, left out as ``tok_s``
  leaves it out), the decode hit rate, MiB read and the wait for reads per token;
- ``ExpertSnapshot``: the expert cache as it stood at one instant (which entries are
  resident, how many routed slots chose each since the session opened, its counters);
- ``ExpertHeat``: recent routing per (layer, expert), decayed with a half-life, from the
  snapshots' cumulative counts; ``heat_levels`` quantises it for display.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.metrics import ProgressTotals
from bmoe.domain.streaming import MIB, StreamCounters

HEAT_TOP = 7  # heat levels 0..HEAT_TOP
HEAT_HALF_LIFE_S = 2.0
HEAT_FLOOR = 0.25  # heat below a quarter of one routed slot shows as none


@attrs.define
class LiveTotals(ProgressTotals):
    """One request's figures as its tokens come (``add`` each ``Progress``); each figure is
    None where it is not defined yet (no decode token, no expert request, not streaming)."""

    @property
    def decode_tokens(self) -> int:
        return max(0, self.tokens - 1)

    @property
    def tok_s(self) -> float | None:
        """Decode tokens per second; None before the second token."""
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    @property
    def hit_pct(self) -> float | None:
        """Percent of the expert requests served from the cache; None without any."""
        total = self.hits + self.misses
        return 100.0 * self.hits / total if total else None

    @property
    def read_mib_per_token(self) -> float | None:
        if not self.streaming or not self.tokens:
            return None
        return self.bytes_read / MIB / self.tokens

    @property
    def stall_ms_per_token(self) -> float | None:
        if not self.streaming or not self.tokens:
            return None
        return 1000.0 * self.stall_s / self.tokens


@attrs.frozen
class ExpertSnapshot:
    """The expert cache at one instant. ``resident[layer * n_expert + e]`` is 1 where the
    entry is in the cache; ``routed`` (as many) counts the routed slots that chose it since
    the session opened; ``layers``: the layers whose experts are streamed."""

    n_layer: int
    n_expert: int
    layers: tuple[int, ...]
    resident: bytes
    routed: tuple[int, ...]
    counters: StreamCounters

    def __attrs_post_init__(self) -> None:
        n = self.n_layer * self.n_expert
        if len(self.resident) != n or len(self.routed) != n:
            raise ValueError(f"a snapshot of {self.n_layer} x {self.n_expert} entries needs {n} of each")
        if any(not 0 <= layer < self.n_layer for layer in self.layers):
            raise ValueError("a streamed layer out of range")

    def resident_row(self, layer: int) -> bytes:
        return self.resident[layer * self.n_expert : (layer + 1) * self.n_expert]


class ExpertHeat:
    """Recent routing per entry: each ``update`` adds the routed slots counted since the
    previous one and decays what was there by ``0.5 ** (elapsed / half_life_s)``. The first
    update only takes its counts as the base (what was routed before the view opened is not
    recent). Counts that went down (another session's) restart the base.

    ``levels()`` scales the heat to a peak that follows the hottest entry up at once and
    down four times slower, so a grid left idle cools down to nothing rather than keeping
    its last pattern at full strength."""

    def __init__(self, half_life_s: float = HEAT_HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("the half-life must be > 0")
        self.half_life_s = half_life_s
        self._base: npt.NDArray[np.int64] | None = None
        self._heat: npt.NDArray[np.float64] = np.zeros(0)
        self._peak = 0.0
        self._t = 0.0

    def update(self, routed: Sequence[int], now: float) -> npt.NDArray[np.float64]:
        """The heat after ``routed`` (cumulative counts) seen at ``now`` (seconds)."""
        counts = np.asarray(routed, dtype=np.int64)
        if self._base is None or self._base.shape != counts.shape:
            self._base, self._heat, self._peak, self._t = counts, np.zeros(counts.shape), 0.0, now
            return self._heat.copy()
        delta = counts - self._base
        if (delta < 0).any():
            delta = np.zeros(counts.shape, dtype=np.int64)
        elapsed = max(0.0, now - self._t)
        self._heat = self._heat * 0.5 ** (elapsed / self.half_life_s) + delta
        hottest = float(self._heat.max()) if self._heat.size else 0.0
        self._peak = max(hottest, self._peak * 0.5 ** (elapsed / (4 * self.half_life_s)))
        self._base, self._t = counts, now
        return self._heat.copy()

    def levels(self, top: int = HEAT_TOP) -> list[int]:
        """The heat as levels 0..``top`` (``heat_levels`` against the peak)."""
        return heat_levels(self._heat, self._peak, top)

    def warm(self) -> bool:
        """Whether some entry still shows heat (a view cooling down)."""
        return bool((self._heat > HEAT_FLOOR).any())


def heat_levels(
    heat: npt.NDArray[np.float64], peak: float, top: int = HEAT_TOP, floor: float = HEAT_FLOOR
) -> list[int]:
    """Heat as levels 0..``top``: 0 at or below ``floor`` (a fraction of one routed slot),
    else ``ceil(top * h / peak)`` (so anything routed recently is at least 1)."""
    ref = max(peak, float(heat.max()) if heat.size else 0.0)
    return [0 if h <= floor else min(top, math.ceil(top * h / ref)) for h in heat.tolist()]
