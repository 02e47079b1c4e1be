"""``LlamaBatchBackend``: ``IBatchBackend`` over a llama.cpp context of several sequences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.decide_backend import load_into_seq, save_seq_state
from bmoe.adapters.llama.generate_backend import constrained_sampler, token_logprob
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.sampler import Sampler
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.generation import TokenLogprob
from bmoe.domain.kv_reuse import swa_prefix_usable
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import ConfigError


class LlamaBatchBackend:
    """Borrows the session's model and context (created with ``n_seq_max`` sequences);
    owns one sampler per sequence. ``on_step(n)`` runs before each decode: ``n`` decode tokens
    of ``n`` sequences (1 for a prefill), so that a streamed session counts a step of ``n``
    tokens as decode (a step that also holds a joining prompt's chunk is more tokens: a
    prefill's, to the streamer)."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, on_step: Callable[[int], None]) -> None:
        self.model = model
        self.ctx = ctx
        self.on_step = on_step
        self._samplers: dict[int, Sampler] = {}

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def n_seq(self) -> int:
        return self.ctx.params.n_seq_max

    def clear(self) -> None:
        self.ctx.clear()

    def drop(self, seq: int) -> None:
        if not self.ctx.remove_from(0, seq):
            raise ConfigError("this model's memory cannot drop one sequence (recurrent state)")

    def keep(self, seq: int, n_keep: int) -> bool | None:
        if not self.ctx.remove_from(n_keep, seq):
            return False  # recurrent / hybrid memory: left as it was (llama_memory_seq_rm's contract)
        return True if swa_prefix_usable(n_keep, self.ctx.pos_min(seq), self.model.n_swa) else None

    def prefill(self, seq: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        self.on_step(1)
        self.ctx.decode(tokens, start_pos, seq=seq)

    def save_state(self, seq: int) -> StateBlob | None:
        return save_seq_state(self.ctx, seq)

    def load_state(self, seq: int, blob: StateBlob) -> bool:
        return load_into_seq(self.ctx, blob, seq)

    @property
    def n_batch(self) -> int:
        return self.ctx.params.n_batch

    def step(
        self,
        entries: Sequence[tuple[int, int, int]],
        outputs: Sequence[bool] | None = None,
        *,
        n_decode: int | None = None,
    ) -> None:
        self.on_step(len(entries) if n_decode is None else max(1, n_decode))
        self.ctx.decode_step(entries, outputs)

    def start_sampling(self, seq: int, params: SamplingParams, constraint: OutputConstraint | None) -> None:
        old = self._samplers.pop(seq, None)
        if old is not None:
            old.close()
        self._samplers[seq] = constrained_sampler(params, self.model, self.ctx.n_ctx, constraint)

    def sample(self, seq: int, row: int) -> int:
        return self._samplers[seq].sample(self.ctx, row)

    def token_logprob(self, row: int, token: int, top: int) -> TokenLogprob:
        return token_logprob(self.model, self.ctx.logits(row), token, top)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.model.token_bytes(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def close_samplers(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        self._samplers.clear()
