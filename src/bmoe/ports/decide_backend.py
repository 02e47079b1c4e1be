"""``IDecideBackend``: what a decision needs from an engine.

Policy (where the prefix ends, which choices are refused, when a kept state is restored,
stored or left alone, how choices are scored, timing) lives in ``bmoe.domain.decide`` and
``bmoe.service.decider``. The backend only does what it is told, on one sequence of model
memory, and says in each method what it returns on failure and what state it leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.media.images import Image


class IDecideBackend(Protocol):
    """A model with one sequence of memory, its tokenizer and its chat template."""

    @property
    def n_ctx(self) -> int:
        """Context length fixed at creation, in tokens."""
        ...

    def render(self, user_message: str) -> str:
        """The prompt text of a fresh chat whose only turn is ``user_message``, reasoning off,
        the assistant turn opened. Raises ``ConfigError`` (template failure); memory untouched."""
        ...

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text``: ``special`` parses special tokens and adds the model's BOS
        (a rendered prompt); without it, the literal text alone (a choice). Raises
        ``TokenizeError``; memory untouched."""
        ...

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        """``tokenize(text, special=True)`` for a prompt placing ``images`` (one media marker
        each): each image a run of row ids ``prefill`` decodes as the image. Raises
        ``ImageError`` (no vision encoder, a picture that does not decode)."""
        ...

    def reset(self) -> None:
        """Empty the memory (the next ``prefill`` starts at position 0). Never fails."""
        ...

    def prefill(self, tokens: Sequence[int], start_pos: int) -> None:
        """Compute ``tokens`` at ``start_pos...`` into the memory, logits for the last one.
        Raises ``DecodeAbortedError`` (cancel) or another ``DecodeError``, after which the
        memory is in an unknown state (``reset()`` it)."""
        ...

    def logits(self) -> npt.NDArray[np.float32]:
        """A copy of the logits row of the last token prefilled. Raises ``ValueError`` when
        none was computed since the last ``reset``/``load_state``; memory untouched."""
        ...

    def save_state(self) -> StateBlob | None:
        """A read-only copy of the whole sequence state (recurrent layers included), or None
        when it could not be copied; memory untouched either way."""
        ...

    def load_state(self, blob: StateBlob) -> bool:
        """Replace the memory with ``blob`` (from ``save_state`` on this model and context
        shape); the next ``prefill`` goes on after its tokens. False when it does not load,
        and the memory is then empty."""
        ...
