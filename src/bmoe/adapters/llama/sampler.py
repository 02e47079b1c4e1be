"""``Sampler``: llama.cpp's sampler chain (greedy by default)."""

from __future__ import annotations

from types import TracebackType

import llama_cpp

from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.token_mask import ITokenMask, MaskSampler
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import ConfigError, GrammarError


class Sampler:
    """Owns a ``llama_sampler`` chain built from ``SamplingParams`` and an optional grammar.

    In llama.cpp's order: logit biases, the repeat/frequency/presence penalties of the tokens
    this chain accepted (over the last ``penalty_last_n``, -1: the whole context), the grammar
    (GBNF, root rule ``root``, through llama.cpp's grammar sampler; or a constraint engine's
    token ``mask`` through ``MaskSampler``), then ``temp <= 0`` greedy (argmax), or top-k, top-p,
    min-p, temperature and a seeded draw. A setting at its neutral value adds no sampler, so a
    request without biases, penalties or grammar runs the plain chain it always ran.
    """

    def __init__(
        self,
        params: SamplingParams,
        model: LlamaModel,
        n_ctx: int,
        grammar: str | None = None,
        mask: ITokenMask | None = None,
    ) -> None:
        self.params = params
        self._mask: MaskSampler | None = None
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._ptr: llama_cpp.llama_sampler_p | None = chain
        try:
            self._add_filters(params, model, n_ctx, grammar, mask)
        except BaseException:
            self.close()
            raise
        self._add_draw(params)

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._ptr, sampler)

    def _add_filters(
        self,
        params: SamplingParams,
        model: LlamaModel,
        n_ctx: int,
        grammar: str | None,
        mask: ITokenMask | None,
    ) -> None:
        if params.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
            for i, (token, bias) in enumerate(params.logit_bias):
                if token >= model.n_vocab:
                    raise ConfigError(f"logit_bias names token {token}; the vocabulary has {model.n_vocab}")
                biases[i].token = llama_cpp.llama_token(token)
                biases[i].bias = bias
            self._add(llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(biases), biases))
        if params.penalised:
            last_n = n_ctx if params.penalty_last_n < 0 else params.penalty_last_n
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    model.n_vocab,
                    last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if grammar is not None:
            sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), b"root")
            if not sampler:
                raise GrammarError("llama.cpp could not parse the grammar (its log says where)")
            self._add(sampler)
        if mask is not None:  # made here, added at once: the chain owns (and frees) it from now on
            self._mask = MaskSampler(mask)
            self._add(self._mask.pointer)

    def _add_draw(self, params: SamplingParams) -> None:
        if params.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temp))
        self._add(llama_cpp.llama_sampler_init_dist(params.seed))

    def sample(self, ctx: LlamaContext, row: int = -1) -> int:
        """Draw the next token from output row ``row`` of ``ctx``'s logits (``-1``: the last
        one computed) and accept it."""
        if self._ptr is None:
            raise ValueError("the sampler is closed")
        token = int(llama_cpp.llama_sampler_sample(self._ptr, ctx.ptr, row))
        if self._mask is not None:
            self._mask.check()
        return token

    def close(self) -> None:
        if self._ptr is not None:
            llama_cpp.llama_sampler_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
