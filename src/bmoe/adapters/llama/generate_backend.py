"""``LlamaGenerateBackend``: ``IGenerateBackend`` over a llama.cpp model, context and sampler."""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.sampler import Sampler


class LlamaGenerateBackend:
    """Borrows (does not own) a model, a context on it and a sampler."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, sampler: Sampler) -> None:
        self.model = model
        self.ctx = ctx
        self.sampler = sampler

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def token_bytes(self, token: int) -> bytes:
        return self.model.token_bytes(token)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def reset(self) -> None:
        self.ctx.clear()

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        self.ctx.decode(tokens, start_pos)

    def sample(self) -> int:
        return self.sampler.sample(self.ctx)
