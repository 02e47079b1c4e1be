"""``IGenerateBackend``: what a generation needs from a language-model engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class IGenerateBackend(Protocol):
    """A model with one sequence of context, a tokenizer and a sampler.

    Policy (when to stop, what fits, timing) lives in ``bmoe.service``; the backend only
    does what it is told.
    """

    @property
    def n_ctx(self) -> int:
        """Context length fixed at creation, in tokens."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens parsed. Raises ``TokenizeError``."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """Bytes of one token as text (control tokens render as nothing)."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for an end-of-generation token."""
        ...

    def reset(self) -> None:
        """Forget the whole context (the next ``feed`` starts at position 0)."""
        ...

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        """Compute ``tokens`` at ``start_pos...`` into the context, logits for the last one.

        Raises ``DecodeError`` (the context is then in an unknown state: ``reset`` it).
        """
        ...

    def sample(self) -> int:
        """Choose the next token from the last logits (and let the sampler accept it)."""
        ...
