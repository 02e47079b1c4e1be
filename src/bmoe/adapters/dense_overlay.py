"""Step 2 of ``ExpertStreaming.attach``, the *overlay*: the dense bytes in anonymous memory.

Each file's data region of llama.cpp's mapping is replaced by anonymous memory; the dense
bytes (everything but routed experts) are copied in once, so nothing in use still points
into the file, and the experts' pages stay empty until a read fills them. The dense ranges
are advised to use transparent huge pages, the expert ranges against them (docs/streaming.md,
"Overlay").
"""

from __future__ import annotations

import os

from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation
from bmoe.adapters.native_errors import native_call
from bmoe.cext import expert_stream

PAGE = 4096


def _page_floor(x: int) -> int:
    return x - x % PAGE


def _page_ceil(x: int) -> int:
    return _page_floor(x + PAGE - 1)


def _complement(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    out = []
    pos = start
    for a, b in sorted(ranges):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < end:
        out.append((pos, end))
    return out


def overlay_dense(
    streamer: expert_stream.ExpertStreamer,
    layout: ModelLayout,
    found: list[tuple[int, int, TensorLocation]],
    bases: dict[int, int],
) -> int:
    """Overlay every mapped file's data region (``bases``: where llama.cpp mapped each file's
    byte 0) and copy the dense bytes in: all but the routed experts in ``found`` and the
    weights llama.cpp placed on a device. The bytes copied."""
    expert_ranges: dict[int, list[tuple[int, int]]] = {}
    for _, _, loc in found:
        expert_ranges.setdefault(loc.file_index, []).append((loc.offset, loc.offset + loc.n_bytes))
    # weights llama.cpp placed on a device are not read from the mapping: not copied
    not_copied = {i: list(r) for i, r in expert_ranges.items()}
    for name in streamer.captured_on_devices():
        if (at := layout.tensors.get(name)) is not None:
            not_copied.setdefault(at.file_index, []).append((at.offset, at.offset + at.n_bytes))
    dense = 0
    for index, base in bases.items():
        tensors = layout.in_file(index)
        start = _page_floor(min(t.offset for t in tensors))
        end = _page_ceil(max(t.offset + t.n_bytes for t in tensors))
        end = min(end, _page_ceil(layout.sizes[index]))
        fills = _complement(sorted(not_copied.get(index, [])), start, min(end, layout.sizes[index]))
        with native_call(f"expert streaming: copying the dense weights of {layout.paths[index]}"):
            fd = os.open(layout.paths[index], os.O_RDONLY)
            try:
                expert_stream.overlay_anonymous(base + start, end - start)
                for a, b in expert_ranges.get(index, []):
                    expert_stream.advise_hugepages(base + a, b - a, False)
                for a, b in fills:
                    expert_stream.advise_hugepages(base + a, b - a, True)
                    expert_stream.fill_from_file(fd, a, base + a, b - a)
                    dense += b - a
                expert_stream.drop_file_cache(fd)
            finally:
                os.close(fd)
    return dense
