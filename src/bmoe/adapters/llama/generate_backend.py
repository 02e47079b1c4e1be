"""``LlamaGenerateBackend``: ``IGenerateBackend`` over a llama.cpp model and context."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bmoe.adapters.llama import guidance
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.decide_backend import load_seq_state, save_seq_state
from bmoe.adapters.llama.grammar import constraint_gbnf
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.sampler import Sampler
from bmoe.adapters.llama.vision import no_vision_encoder
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.kv_reuse import swa_prefix_usable
from bmoe.domain.media import Image
from bmoe.domain.sampling import SamplingParams
from bmoe.ports.generate_backend import IGenerateBackend


def token_logprob(model: LlamaModel, logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under ``logits`` (their log-softmax over the vocabulary)
    and the ``top`` most likely tokens, most likely first."""
    logp = log_softmax(logits)

    def choice(t: int) -> TokenChoice:
        return TokenChoice(t, model.token_bytes(t), float(logp[t]))

    best: list[int] = []
    if top > 0:
        part = np.argpartition(-logp, min(top, logp.size - 1))[:top]
        best = [int(t) for t in part[np.argsort(-logp[part], kind="stable")]]
    return TokenLogprob(choice(token), tuple(choice(t) for t in best))


def constrained_sampler(
    params: SamplingParams, model: LlamaModel, n_ctx: int, constraint: OutputConstraint | None
) -> Sampler:
    """A sampler chain for ``params`` holding the reply to ``constraint``: GBNF through
    llama.cpp's grammar sampler, JSON schemas and tool calls through llguidance's mask where
    it is installed (else llama-cpp-python's converter, as GBNF). Raises ``GrammarError``."""
    grammar = mask = None
    if constraint is not None and constraint.kind != "gbnf" and guidance.available():
        mask = guidance.GuidanceMask(constraint, model)
    elif constraint is not None:
        grammar = constraint_gbnf(constraint)
    return Sampler(params, model, n_ctx, grammar, mask)


class LlamaGenerateBackend(IGenerateBackend):
    """Borrows a model and a context created with ``abort=flag`` (the same ``AbortFlag``);
    owns the sampler of the current generation. A streaming fault surfaces from ``feed``
    through the context's ``explain_abort``. ``on_rows(n)``, where set (the streamer's
    ``set_decode_rows``), is told before a verify's batch of ``n`` rows and after it (1): the
    batch is a decode step of ``n`` rows, whose experts' union is read, not a prefill's
    (which, routing half a layer's experts or more, reads the whole next layer ahead)."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, flag: AbortFlag) -> None:
        self.model = model
        self.ctx = ctx
        self.flag = flag
        self._sampler: Sampler | None = None
        self.on_rows: Callable[[int], None] | None = None

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize_prompt(text)

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        raise no_vision_encoder(images)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.model.token_bytes(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def reset(self) -> None:
        self.ctx.clear()

    def keep_prefix(self, n_keep: int) -> bool:
        if not self.ctx.remove_from(n_keep):
            return False  # recurrent / hybrid memory: no partial removal
        return swa_prefix_usable(n_keep, self.ctx.pos_min(), self.model.n_swa)

    def save_state(self) -> StateBlob | None:
        return save_seq_state(self.ctx)

    def load_state(self, blob: StateBlob) -> bool:
        return load_seq_state(self.ctx, blob)

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        self.ctx.decode(tokens, start_pos)

    def feed_rows(self, tokens: Sequence[int], start_pos: int) -> np.ndarray:
        if self.on_rows is None or len(tokens) < 2:
            return self.ctx.decode_all_rows(tokens, start_pos)
        self.on_rows(len(tokens))
        try:
            return self.ctx.decode_all_rows(tokens, start_pos)
        finally:
            self.on_rows(1)

    def start_sampling(self, params: SamplingParams, constraint: OutputConstraint | None = None) -> None:
        self.close_sampler()
        self._sampler = constrained_sampler(params, self.model, self.ctx.n_ctx, constraint)

    def sample(self) -> int:
        if self._sampler is None:
            raise ValueError("start_sampling() first")
        return self._sampler.sample(self.ctx)

    def token_logprob(self, token: int, top: int) -> TokenLogprob:
        return token_logprob(self.model, self.ctx.logits(-1), token, top)

    def abort(self) -> None:
        self.flag.set()

    def clear_abort(self) -> None:
        self.flag.clear()

    def close_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None
