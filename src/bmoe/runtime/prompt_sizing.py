"""A streamed session's prompt batch, chosen when it opens (``StreamConfig.size_prompt_batch``):
a probe context measures llama.cpp's compute buffer per ubatch token and the KV cache, the
memory room is read, and ``bmoe.domain.streaming.prefill_memory.choose_prompt_batch`` does
the arithmetic. The probe has no eval callback and is freed before the session's context is
made (its compute buffer was reserved, not touched). Without flash attention, where the room
cut the batch below the context, a second probe with it on says what ``-fa on`` would allow
(the ``mode:`` line shows it; flash attention changes the output, so it is never chosen for
the user)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import attrs

from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation
from bmoe.adapters.llama import LlamaContext, LlamaModel
from bmoe.adapters.llama.context import ContextParams
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.streaming.config import STREAMED_PROMPT_BATCH, StreamConfig
from bmoe.domain.streaming.prefill_memory import (
    LEND_FROM_TOKENS,
    PrefillRoom,
    PromptBatch,
    choose_prompt_batch,
)
from bmoe.errors import BmoeError


def expert_bytes_by_layer(found: Sequence[tuple[int, int, TensorLocation]]) -> dict[int, int]:
    """Each layer's routed experts, in bytes (every projection of every expert)."""
    by_layer: dict[int, int] = {}
    for layer, _, loc in found:
        by_layer[layer] = by_layer.get(layer, 0) + loc.n_bytes
    return by_layer


def prefill_room(
    room_bytes: int,
    layout: ModelLayout,
    found: Sequence[tuple[int, int, TensorLocation]],
    kv_bytes: int,
    compute_per_token: float,
) -> PrefillRoom:
    """The figures a prompt batch is chosen (or lent the room) from: the room read before the
    context was made, the dense part (the files less the routed experts), the KV cache, the
    largest layer's experts, the compute buffer a token."""
    layers = expert_bytes_by_layer(found)
    return PrefillRoom(
        room_bytes=room_bytes,
        dense_bytes=max(0, sum(layout.sizes) - sum(layers.values())),
        kv_bytes=kv_bytes,
        layer_bytes=max(layers.values(), default=0),
        compute_per_token=compute_per_token,
    )


def size_prompt_batch(
    model: LlamaModel,
    context: ContextParams,
    layout: ModelLayout,
    found: Sequence[tuple[int, int, TensorLocation]],
    memory_room: Callable[[], MemoryRoom],
) -> tuple[ContextParams, PromptBatch]:
    """``context`` with ``n_batch = n_ubatch`` the prompt batch the room allows, and how it
    was chosen."""
    room = memory_room().room_bytes  # nothing of this run's in memory yet but the model's maps
    per_token, kv = probe(model, context)
    prefill = prefill_room(room, layout, found, kv, per_token)
    batch = choose_prompt_batch(context.n_ctx, prefill, least=context.n_seq_max)
    if context.flash_attn == "off" and batch.tokens < context.n_ctx:
        # what flash attention would allow (no attention scores of batch x context floats)
        with contextlib.suppress(BmoeError):
            flash_per_token, _ = probe(model, attrs.evolve(context, flash_attn="on"))
            flash = choose_prompt_batch(
                context.n_ctx,
                attrs.evolve(prefill, compute_per_token=flash_per_token),
                least=context.n_seq_max,
            )
            if flash.tokens > batch.tokens:
                batch = attrs.evolve(batch, with_flash=flash.tokens)
    return attrs.evolve(context, n_batch=batch.tokens, n_ubatch=batch.tokens), batch


def lends_given_batch(stream: StreamConfig, n_ubatch: int) -> bool:
    """A ``-b`` given beside ``--cache-mb auto``: the cache lends a prompt-sized ubatch its
    room as it does a batch it sized (without, the budget gives up the whole compute buffer
    for good, and what llama.cpp's CPU backend takes beside it during a prompt found no room:
    the trained bench model at ``-b 1920`` was OOM-killed by a 2,048-token prompt in 2 GiB)."""
    return (
        stream.enabled
        and not stream.size_prompt_batch
        and stream.cache_mb is None
        and (n_ubatch > LEND_FROM_TOKENS)
    )


def given_prompt_batch(
    n_ubatch: int,
    room_bytes: int,
    found: Sequence[tuple[int, int, TensorLocation]],
    layout: ModelLayout,
    compute_per_token: float,
    kv_bytes: int,
) -> PromptBatch:
    """The prompt batch ``-b`` gave, with the room it was given in (read before the context
    was made) and the context's own compute buffer a token: for the cache's lending."""
    return PromptBatch(
        n_ubatch, prefill_room(room_bytes, layout, found, kv_bytes, compute_per_token), given=True
    )


def probe(model: LlamaModel, context: ContextParams) -> tuple[float, int]:
    """``(compute buffer bytes per ubatch token, KV cache bytes)`` of a context like
    ``context``, from a probe at ``STREAMED_PROMPT_BATCH`` tokens (at most the context)."""
    start = min(context.n_ctx, STREAMED_PROMPT_BATCH)
    with LlamaContext(model, attrs.evolve(context, n_batch=start, n_ubatch=start)) as ctx:
        return ctx.compute_buffer_bytes / start, ctx.kv_bytes
