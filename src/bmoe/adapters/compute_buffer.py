"""llama.cpp's compute buffer given back to the system between prompts.

llama.cpp reserves a context's compute buffer for its largest ubatch when it creates the
context and keeps it until the context is freed. Its pages are taken only as graphs touch
them, but a prompt-sized ubatch touches most of it, and they stay taken: after a long
prompt the process would hold a prompt-sized buffer through every decode step. The buffer
is scratch memory (each graph writes its nodes before reading them; the inputs are set and
the outputs copied out on every ``llama_decode``), so between two decodes its pages can go
back (``madvise(MADV_DONTNEED)``) and the next graph takes zeroed pages as it touches them.

Which buffer: the one the last graph's routing node lived in, as the expert streamer's
callback saw it (``ExpertStreamer.compute_buffer``), checked through ggml's API to be a
host buffer reserved for compute (``GGML_BACKEND_BUFFER_USAGE_COMPUTE``); only the pages
wholly inside ``[base, base + size)`` go. The gates check that the output stays bit for bit
and that the memory goes (tests/gates/test_prompt_batch_gates.py).
"""

from __future__ import annotations

import ctypes
import functools

from bmoe.adapters.llama.ggml_symbols import typed
from bmoe.cext import expert_stream

USAGE_COMPUTE = 2  # enum ggml_backend_buffer_usage: GGML_BACKEND_BUFFER_USAGE_COMPUTE


@functools.cache
def _api() -> dict[str, ctypes._CFuncPtr]:  # type: ignore[name-defined]
    p = ctypes.c_void_p
    return {
        "base": typed("ggml_backend_buffer_get_base", p, p),
        "size": typed("ggml_backend_buffer_get_size", ctypes.c_size_t, p),
        "usage": typed("ggml_backend_buffer_get_usage", ctypes.c_int, p),
        "host": typed("ggml_backend_buffer_is_host", ctypes.c_bool, p),
    }


def compute_buffer_span(buffer: int) -> tuple[int, int] | None:
    """``(base, size)`` of ``buffer`` (a ``ggml_backend_buffer_t``) where it is host memory
    reserved for compute; None otherwise (or for 0)."""
    if not buffer:
        return None
    api = _api()
    if api["usage"](buffer) != USAGE_COMPUTE or not api["host"](buffer):
        return None
    base = int(api["base"](buffer) or 0)
    size = int(api["size"](buffer))
    return (base, size) if base and size else None


def release_compute_buffer(buffer: int) -> int:
    """Give ``buffer``'s pages back (between decodes only); the bytes given back (0 where it
    is not a host compute buffer)."""
    span = compute_buffer_span(buffer)
    if span is None:
        return 0
    return expert_stream.give_back(*span)
