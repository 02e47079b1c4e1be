"""Step 1 of ``ExpertStreaming.attach``, the *capture*: where llama.cpp put each file.

One warm-up decode in capture mode records the address of every weight the graph reads
(``capture``); with the GGUF layout this gives, per file, the base of llama.cpp's mapping
(``locate_experts``). Every weight must agree on it: otherwise the weights are not where
streaming needs them, and the model stays resident (``StreamingUnavailable``).
"""

from __future__ import annotations

import contextlib

from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.model import LlamaModel
from bmoe.cext import expert_stream
from bmoe.cext.abort_flag import AbortFlag
from bmoe.errors import DecodeAbortedError


class StreamingUnavailable(Exception):
    """Why a model runs resident instead (a message for the user, not an error)."""


def capture(ctx: LlamaContext, streamer: expert_stream.ExpertStreamer, abort: AbortFlag | None) -> set[str]:
    """One decode of token 0 in capture mode: the ``ask`` pass of llama.cpp's scheduler
    records every weight the graph reads before anything computes. The names seen, in host
    memory and on devices.

    With ``abort`` (the context's abort flag) set before it, the decode stops after that
    pass: after a lazy load (``ModelParams.populate``) computing the token would read the
    pages of every expert it routes, and the kernel's read-around with them (2.4 GB of the
    2.6 GB trained bench model here, with this disk's 8 MiB read-ahead). A graph in several
    parts (layers on devices) stops after the first part: the caller checks what was seen
    and captures again, computing."""
    streamer.mode = expert_stream.MODE_CAPTURE  # a second capture adds to the first (by name)
    try:
        if abort is None:
            ctx.decode([0], 0)
        else:
            abort.set()
            try:
                with contextlib.suppress(DecodeAbortedError):
                    ctx.decode([0], 0)
            finally:
                abort.clear()
    finally:
        streamer.mode = expert_stream.MODE_OFF
        ctx.clear()
    return set(streamer.captured()) | set(streamer.captured_on_devices())


def _mapping_bases(layout: ModelLayout, captured: dict[str, int]) -> dict[int, int]:
    """Per file, the address where llama.cpp mapped its byte 0."""
    bases: dict[int, set[int]] = {}
    for name, address in captured.items():
        loc = layout.tensors.get(name)
        if loc is not None:
            bases.setdefault(loc.file_index, set()).add(address - loc.offset)
    out = {}
    for index, found in bases.items():
        if len(found) != 1:
            raise StreamingUnavailable(
                "weights do not lie in llama.cpp's file mapping (repacked or copied?): cannot stream"
            )
        out[index] = found.pop()
    return out


def _on_the_host(
    streamer: expert_stream.ExpertStreamer,
    found: list[tuple[int, int, TensorLocation]],
    captured: dict[str, int],
) -> list[tuple[int, int, TensorLocation]]:
    """The expert tensors llama.cpp placed in host memory (streamed); a layer whose experts
    are all on a device (``--n-cpu-moe`` with ``-ngl``) is served there, not by the streamer."""
    on_host = [f for f in found if f[2].name in captured]
    for layer in {f[0] for f in found} - {f[0] for f in on_host}:
        streamer.serve_elsewhere(layer)
    if not on_host:
        raise StreamingUnavailable("every routed expert is resident on a device: nothing to stream")
    return on_host


def locate_experts(
    model: LlamaModel,
    ctx: LlamaContext,
    streamer: expert_stream.ExpertStreamer,
    layout: ModelLayout,
    found: list[tuple[int, int, TensorLocation]],
) -> tuple[list[tuple[int, int, TensorLocation]], dict[int, int]]:
    """Capture where llama.cpp put each file and tell the streamer where each expert
    projection lies (in the mapping and in its file). The expert tensors in host memory (the
    streamed ones) and, per file, the base of its mapping.

    After a lazy load the capture stops before computing, and is made again computing when it
    missed a routed tensor (``capture``)."""
    abort = ctx.abort
    if not (
        model.lazy_load
        and isinstance(abort, AbortFlag)
        and capture(ctx, streamer, abort) >= {loc.name for _, _, loc in found}
    ):
        capture(ctx, streamer, None)
    if streamer.capture_overflow:
        raise StreamingUnavailable("the graph reads more weight tensors than bmoe can locate")
    captured = streamer.captured()  # weights in host memory only
    found = _on_the_host(streamer, found, captured)
    bases = _mapping_bases(layout, captured)
    missing = {loc.file_index for _, _, loc in found} - set(bases)
    if missing:
        raise StreamingUnavailable(f"no weight of file(s) {sorted(missing)} was seen: cannot locate them")
    for layer, p, loc in found:
        streamer.set_projection(
            layer,
            p,
            bases[loc.file_index] + loc.offset,
            loc.n_bytes // model.n_expert,
            loc.file_index,
            loc.offset,
        )
    return found, bases
