"""Whether evicted pages may be recycled (moved under the slices the next read fills).

Each move leaves the expert slices it touched as separate memory mappings of the process: up
to two per slice (the slice, and the page it shares with a neighbour) once a long session has
read every expert. A process has at most ``vm.max_map_count`` mappings, and every allocation
of the process (llama.cpp's, Python's) needs some, so recycling is used only where the worst
case leaves room.
"""

from __future__ import annotations

MAPPINGS_PER_SLICE = 2
HEADROOM_MIN = 8192  # mappings kept for everything else in the process


def recycling_fits(n_slices: int, max_map_count: int, in_use: int) -> bool:
    """Whether ``n_slices`` expert slices (layers x experts x projections) may each become up
    to two mappings, next to ``in_use`` mappings, within ``max_map_count`` and a headroom of
    an eighth of it (at least 8,192)."""
    headroom = max(HEADROOM_MIN, max_map_count // 8)
    return in_use + MAPPINGS_PER_SLICE * n_slices + headroom <= max_map_count


def worst_case_mappings(n_slices: int) -> int:
    return MAPPINGS_PER_SLICE * n_slices
