"""``IBatchBackend``: what generating several sequences at once needs from an engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.generation import TokenLogprob
from bmoe.domain.sampling import SamplingParams


class IBatchBackend(Protocol):
    """A model with ``n_seq`` sequences in one context, a sampler per sequence.

    ``prefill`` computes one sequence's prompt (its logits: output row -1 until the next
    call); ``step`` computes one token of each sequence it names in one decode (output row
    ``i`` is entry ``i``'s). Policy (which sequences run, when one stops) is the caller's.
    """

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_seq(self) -> int: ...

    def clear(self) -> None:
        """Forget every sequence."""
        ...

    def drop(self, seq: int) -> None:
        """Forget sequence ``seq``'s positions (its slot then starts again at 0)."""
        ...

    def keep(self, seq: int, n_keep: int) -> bool | None:
        """Remove ``seq``'s positions from ``n_keep`` on, keeping the rest: True when done (and
        the prefix still usable); False when the memory cannot remove a part and was left as
        it was (recurrent state); None when the cut left nothing usable (a sliding window
        that pruned cells the prefix needs). Either way but True, a caller that needs the
        prefix drops ``seq``."""
        ...

    def prefill(self, seq: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        """Compute ``tokens`` at positions ``start_pos...`` of ``seq``, logits for the last one."""
        ...

    def save_state(self, seq: int) -> StateBlob | None:
        """A copy of sequence ``seq``'s whole state, or None when the engine copies nothing."""
        ...

    def load_state(self, seq: int, blob: StateBlob) -> bool:
        """Put a state ``save_state`` made (of any sequence) into ``seq``, the others
        untouched; False, and ``seq`` empty, when the engine refuses it."""
        ...

    @property
    def n_batch(self) -> int:
        """The most tokens one decode holds."""
        ...

    def step(
        self,
        entries: Sequence[tuple[int, int, int]],
        outputs: Sequence[bool] | None = None,
        *,
        n_decode: int | None = None,
    ) -> None:
        """One decode of ``(token, position, sequence)`` entries, logits for each (or for
        those ``outputs`` flags; output row ``i`` is entry ``i``'s either way). ``n_decode``:
        how many of them are decode tokens of running sequences (the rest: prompts joining;
        None: all)."""
        ...

    def start_sampling(self, seq: int, params: SamplingParams, constraint: OutputConstraint | None) -> None:
        """A fresh sampler for ``seq`` (raises ``GrammarError`` and keeps none when the
        constraint cannot become a grammar)."""
        ...

    def sample(self, seq: int, row: int) -> int:
        """Draw ``seq``'s next token from output row ``row`` and let its sampler accept it."""
        ...

    def token_logprob(self, row: int, token: int, top: int) -> TokenLogprob:
        """``token``'s log-probability under output row ``row`` and the ``top`` likeliest."""
        ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def close_samplers(self) -> None:
        """Free every sequence's sampler."""
        ...
