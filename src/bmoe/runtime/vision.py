"""A session's vision encoder (``SessionConfig.mmproj``) and the backends that feed images."""

from __future__ import annotations

import functools
from collections.abc import Callable

from bmoe.adapters.llama.batch_backend import LlamaBatchBackend
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.generate_backend import LlamaGenerateBackend
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.vision import VisionEncoder
from bmoe.adapters.llama.vision_backend import VisionBatchBackend, VisionGenerateBackend
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.media.positions import PositionLedger
from bmoe.runtime.session_config import SessionConfig

MIB = 1 << 20


def open_encoder(model: LlamaModel, config: SessionConfig) -> VisionEncoder | None:
    """The encoder ``config.mmproj`` holds, loaded for ``model`` (None: text only). Raises
    ``VisionEncoderError`` for a file that is not one, or one made for another model."""
    if config.mmproj is None:
        return None
    return VisionEncoder(
        model,
        config.mmproj,
        n_threads=config.context.n_threads,
        image_min_tokens=config.image_min_tokens,
        image_max_tokens=config.image_max_tokens,
        cache_bytes=config.image_cache_mb * MIB,
    )


def image_cache_bytes(config: SessionConfig) -> int:
    """What the vision encoder may keep (``--image-cache-mb``; 0 without one): a streamed
    run sets it aside as it does the prompt cache's memory tier."""
    return config.image_cache_mb * MIB if config.mmproj is not None else 0


def batch_backend(
    model: LlamaModel, ctx: LlamaContext, encoder: VisionEncoder | None
) -> Callable[[Callable[[int], None]], LlamaBatchBackend]:
    """The maker of the session's parallel-sequence backend (given its step hook); with an
    encoder, every backend it makes shares one ledger per sequence (the slots' images'
    positions, kept from one run to the next as their KV is)."""
    if encoder is None:
        return functools.partial(LlamaBatchBackend, model, ctx)
    ledgers = [PositionLedger() for _ in range(ctx.params.n_seq_max)]
    return functools.partial(_vision_batch, model, ctx, encoder, ledgers)


def _vision_batch(
    model: LlamaModel,
    ctx: LlamaContext,
    encoder: VisionEncoder,
    ledgers: list[PositionLedger],
    on_step: Callable[[int], None],
) -> LlamaBatchBackend:
    return VisionBatchBackend(model, ctx, on_step, encoder, ledgers)


def generate_backend(
    model: LlamaModel, ctx: LlamaContext, flag: AbortFlag, encoder: VisionEncoder | None
) -> LlamaGenerateBackend:
    """The session's generate backend: one that feeds images where there is an encoder."""
    if encoder is None:
        return LlamaGenerateBackend(model, ctx, flag)
    return VisionGenerateBackend(model, ctx, flag, encoder)
