"""``Sampler``: llama.cpp's sampler chain (greedy by default)."""

from __future__ import annotations

from types import TracebackType

import llama_cpp

from bmoe.adapters.llama.context import LlamaContext
from bmoe.domain.sampling import SamplingParams


class Sampler:
    """Owns a ``llama_sampler`` chain built from ``SamplingParams``.

    ``temp <= 0`` is greedy (argmax). Otherwise top-k, top-p, temperature, then a seeded
    draw, in llama.cpp's usual order.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if params.greedy:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(params.temp))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(params.seed))
        self._ptr: llama_cpp.llama_sampler_p | None = chain

    def sample(self, ctx: LlamaContext) -> int:
        """Draw the next token from the last logits of ``ctx`` and accept it."""
        if self._ptr is None:
            raise ValueError("the sampler is closed")
        return int(llama_cpp.llama_sampler_sample(self._ptr, ctx.ptr, -1))

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
