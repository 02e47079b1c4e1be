"""Whose entries a miss evicts (``--cache-victims``): the rule's choice over every layer, or
the missing layer's own first; or, ``auto``, whichever costs this machine less as the run
goes (``victims_chooser``).

``"layer"`` applies where the layer's share of the budget (the budget
in entries of that layer over the MoE layers) holds at least ``LAYER_VICTIM_CYCLES`` tokens'
top-k; below it the layers' hot experts differ too much for a fixed split, and the global
choice keeps the hot layers' experts. The engine reads each such miss into the row its
victim held (``cext/stream/rows.pxi``): no page moved. ``ExpertCachePolicy`` decides with
these; the C core (``cache_core.pxd``: ``core_layer_first``) follows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from bmoe.domain.streaming.cache_plans import Entry
from bmoe.domain.streaming.use_counts import UseCounts

Victims = Literal["global", "layer"]
VICTIMS: tuple[Victims, ...] = ("global", "layer")
VictimsSetting = Literal["global", "layer", "auto"]
VICTIMS_SETTINGS: tuple[VictimsSetting, ...] = ("global", "layer", "auto")
"""What ``--cache-victims`` takes: a scope, or ``auto`` (the scope chosen as the run goes)."""
DEFAULT_VICTIMS: VictimsSetting = "auto"
"""What streaming uses unless told (``StreamConfig.victims``, ``--cache-victims``). ``layer``
trades hits for page moves: on this project's VM (a page move's TLB shootdown exits to the
hypervisor, the disk reads 2-3 GB/s) the trained bench model at a quarter of its experts
decoded 1.11-1.48x as fast with it, the bench models 1.03-1.20x; but over 248 tokens it hit
44.9% where the global choice hit 47.5% (5% more bytes read), and with the disk held to
400 MiB/s it decoded 0.96x. Where moves are cheap (a phone's broadcast TLB invalidation, no
VM) and the disk slow, the global choice wins; docs/benchmarks.md. So ``auto`` (the
default) chooses from the measured cost of a move and of a read (``victims_chooser``): against
``global``, interleaved, 1.04-1.05x on the 48-layer model at 3,072 MiB and with the auto budget
in 2 GiB (trained and 16-layer models), 0.98x at the edges (the 16-layer model at 1,536 MiB,
the trained one over 248 tokens at 400 MiB/s, where ``layer`` alone decoded 0.95x)."""
LAYER_VICTIM_CYCLES = 2
"""``"layer"`` applies where a layer's share holds this many tokens' top-k."""


def layer_first(victims: Victims, k: int, share: int) -> bool:
    """Whether a miss evicts its layer's own entries first: ``victims`` is ``"layer"``, ``k``
    (experts a token) is known, and the layer's ``share`` of the budget holds
    ``LAYER_VICTIM_CYCLES`` tokens' top-k."""
    return victims == "layer" and k > 0 and share >= LAYER_VICTIM_CYCLES * k


def layer_victim(
    resident: Sequence[Entry], layer: int, keep: frozenset[Entry], by_uses: UseCounts | None
) -> Entry | None:
    """The entry of ``layer`` to evict first, never one of ``keep``: the fewest uses
    (``by_uses``; ``resident``'s order among equals) or the first in ``resident``'s order
    (the eviction order); None where the layer has none to give."""
    mine = [e for e in resident if e[0] == layer and e not in keep]
    if not mine:
        return None
    return by_uses.fewest(mine, keep) if by_uses is not None else mine[0]
