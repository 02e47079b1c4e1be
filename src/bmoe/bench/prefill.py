"""The timed prefill: the prompt, in batches, before the teacher-forced decode.

Decode reads (or pages in) the experts each token routes to, one token at a time; a
prefill routes a whole batch through each layer at once, so it reads most of the model once
and computes many tokens per read. The two speeds answer different questions (how long a
prompt takes, how fast the answer comes), so the bench measures both, on the same text:
the prompt is the first ``--prompt-tokens`` tokens of the sequence every configuration is
fed, and the decode continues from there.

Every configuration takes the prompt in batches of ``--batch-size`` tokens (``n_batch =
n_ubatch``; default :data:`PREFILL_BATCH`, llama-cpp-python's ``Llama`` default, so a prompt
of at most 512 tokens is one graph everywhere), each batch one ``llama_decode``, all of them
timed together. ``--batch-size auto`` lets bmoe's streamed configurations size their batch
from the memory room as ``bmoe.cli --moe-stream`` does without ``-b``: a long prompt then
reads the experts fewer times (the report's passes column).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

PREFILL_BATCH = 512
"""``n_batch`` and ``n_ubatch`` of every configuration's context unless ``--batch-size`` says
otherwise (llama-cpp-python's ``Llama`` default)."""

AUTO_BATCH = "auto"
"""``--batch-size auto``: bmoe's streamed configurations size their prompt batch from the room."""


def context_batch(batch: int | str) -> int:
    """The ``n_batch = n_ubatch`` a configuration's context is made with for ``--batch-size``
    ``batch``: its count, or :data:`PREFILL_BATCH` under ``auto`` (which a streamed session
    then sizes from the room)."""
    return PREFILL_BATCH if batch == AUTO_BATCH else int(batch)


DEFAULT_PROMPT_TOKENS = 464
"""The default prompt: a long chat turn's worth, under one batch."""


class Prefiller(Protocol):
    """A loaded model and context that can take a whole prompt."""

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """Decode ``tokens`` at positions ``0..`` of sequence ``seq`` in batches of the
        context's ``n_batch`` (logits for the last only)."""


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
    """Prefill ``tokens`` (at least one) of sequence ``seq`` and time it."""
    if not tokens:
        raise ValueError("a prefill takes at least one token")
    t = clock()
    stepper.prefill(tokens, seq)
    return Prefill(tokens=len(tokens), seconds=clock() - t)
