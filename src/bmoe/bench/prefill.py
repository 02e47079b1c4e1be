"""The timed prefill: the prompt in one ``llama_decode``, before the teacher-forced decode.

Decode reads (or pages in) the experts each token routes to, one token at a time; a
prefill routes a whole batch through each layer at once, so it reads most of the model once
and computes many tokens per read. The two speeds answer different questions (how long a
prompt takes, how fast the answer comes), so the bench measures both, on the same text:
the prompt is the first ``--prompt-tokens`` tokens of the sequence every configuration is
fed, and the decode continues from there.

One batch of at most :data:`PREFILL_BATCH` tokens, with ``n_batch = n_ubatch`` equal to it
in every configuration (llama-cpp-python's ``Llama`` default), so one call is one ubatch:
the figure is the compute of one graph over the whole prompt, not a split chosen per
configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

PREFILL_BATCH = 512
"""``n_batch`` and ``n_ubatch`` of every configuration's context, and the longest prompt."""

DEFAULT_PROMPT_TOKENS = 464
"""The default prompt: a long chat turn's worth, under one batch."""


class Prefiller(Protocol):
    """A loaded model and context that can take a whole prompt in one ``llama_decode``."""

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """Decode ``tokens`` at positions ``0..`` of sequence ``seq`` in one batch (logits
        for the last only)."""


@attrs.frozen
class Prefill:
    """What the timed prefill measured."""

    tokens: int
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def timed_prefill(
    stepper: Prefiller,
    tokens: Sequence[int],
    *,
    seq: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Prefill:
    """Prefill ``tokens`` (1 to :data:`PREFILL_BATCH` of them) of sequence ``seq`` in one
    call and time it."""
    if not 1 <= len(tokens) <= PREFILL_BATCH:
        raise ValueError(f"a prefill takes 1 to {PREFILL_BATCH} tokens in one batch, not {len(tokens)}")
    t = clock()
    stepper.prefill(tokens, seq)
    return Prefill(tokens=len(tokens), seconds=clock() - t)
