"""Perplexity over a text, the way llama.cpp's ``llama-perplexity`` tool computes it.

The tokens are cut into windows of ``n_ctx`` (the last partial window is dropped; fewer
than ``2 * n_ctx`` tokens is refused). Each window is computed from an empty memory, its
first token replaced by BOS when the model wants one, and only its second half is scored:
the token at position ``i + 1`` given positions ``0..i``, for ``i`` from ``n_ctx // 2`` to
``n_ctx - 2`` (so the model always has half a window of context). The figure is
``exp(mean NLL)``, with the tool's error estimate ``ppl * sqrt(var(NLL) / (count - 1))``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from bmoe.errors import ConfigError


@attrs.frozen
class PplWindow:
    """Tokens ``[start, start + n_ctx)``; rows from ``first`` on are scored."""

    index: int
    start: int
    n_ctx: int

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        return self.n_ctx - self.first - 1


def plan_windows(n_tokens: int, n_ctx: int) -> list[PplWindow]:
    """The windows llama.cpp's tool evaluates. Raises ``ConfigError`` for too short a text."""
    if n_ctx < 4:
        raise ConfigError(f"perplexity needs a context of at least 4 tokens, not {n_ctx}")
    if n_tokens < 2 * n_ctx:
        raise ConfigError(
            f"perplexity with a context of {n_ctx} needs at least {2 * n_ctx} tokens; "
            f"the text tokenizes to only {n_tokens}"
        )
    return [PplWindow(i, i * n_ctx, n_ctx) for i in range(n_tokens // n_ctx)]


@attrs.define
class PplAccumulator:
    """Sums of the negative log-likelihoods of scored tokens."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, logps: Iterable[float]) -> None:
        """Add the log-probabilities of scored tokens."""
        for lp in logps:
            self.nll -= lp
            self.nll2 += lp * lp
            self.count += 1

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count) if self.count else math.nan

    @property
    def error(self) -> float:
        """The tool's "+/-": ``ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1))``."""
        if self.count < 2:
            return math.nan
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return self.ppl * math.sqrt(var / (self.count - 1)) if var > 0 else math.nan
