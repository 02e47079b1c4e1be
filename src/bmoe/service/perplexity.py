"""Perplexity of a text, over a context that returns its logit rows (``Session.perplexity``
and ``perplexity_windows``; ``bmoe.domain.perplexity`` is the windows' policy).

Both run as a request in flight (``SessionEngine.run_exclusive``): the conversation's KV is
forgotten, and the context is left empty, as after a decision. Refusals (too short, too
long) are raised before anything is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.domain.perplexity import PplAccumulator, PplWindow, plan_windows
from bmoe.errors import ConfigError, ContextOverflowError
from bmoe.service.session_engine import SessionEngine

OnWindow = Callable[[PplWindow, PplAccumulator], None]
Tokenize = Callable[[str], list[int]]
"""A text as the model sees it (specials parsed, BOS first when the model wants it)."""


class RowsContext(Protocol):
    """What scoring a text needs from a context (``LlamaContext`` is one)."""

    @property
    def n_ctx(self) -> int: ...

    def clear(self) -> None:
        """Drop every cell of the memory."""
        ...

    def decode_all_rows(self, tokens: Sequence[int], start_pos: int) -> npt.NDArray[np.float32]:
        """Compute ``tokens`` from ``start_pos``; the logits of every one, ``[n, n_vocab]``."""
        ...

    def decode_rows(self, tokens: Sequence[int], start_pos: int, first: int) -> npt.NDArray[np.float32]:
        """Compute ``tokens`` from ``start_pos``; the logits of tokens ``first..`` only."""
        ...


@attrs.frozen
class Perplexity:
    """``logp[i]``: log p(tokens[i + 1] | tokens[: i + 1]) over the whole vocabulary."""

    tokens: tuple[int, ...]
    logp: tuple[float, ...]

    @property
    def value(self) -> float:
        """exp(mean negative log-likelihood)."""
        return float(np.exp(-np.mean(self.logp)))


def perplexity(engine: SessionEngine, ctx: RowsContext, tokenize: Tokenize, text: str) -> Perplexity:
    """Log-probability of each token of ``text`` given the ones before it, from one prefill
    computing every row, with the log-softmax decisions use. ``ConfigError`` for fewer than
    two tokens, ``ContextOverflowError`` for more than the context holds."""
    tokens = tokenize(text)
    if len(tokens) < 2:
        raise ConfigError("perplexity needs at least two tokens")
    if len(tokens) > ctx.n_ctx:
        raise ContextOverflowError(f"{len(tokens)} tokens exceed the context of {ctx.n_ctx}")

    def work() -> Perplexity:
        ctx.clear()
        try:
            rows = ctx.decode_all_rows(tokens, 0)
        finally:
            ctx.clear()
        logp = log_softmax(rows[:-1])[np.arange(len(tokens) - 1), tokens[1:]]
        return Perplexity(tokens=tuple(tokens), logp=tuple(float(x) for x in logp))

    return engine.run_exclusive(work)


def perplexity_windows(
    engine: SessionEngine,
    ctx: RowsContext,
    tokenize: Tokenize,
    text: str,
    n_ctx: int,
    bos: int | None,
    on_window: OnWindow | None = None,
) -> PplAccumulator:
    """Perplexity of ``text`` as llama.cpp's ``llama-perplexity`` computes it: windows of
    ``n_ctx`` tokens, each from an empty memory, ``bos`` first when it is given, the second
    half scored; ``on_window(window, accumulator)`` after each. ``ContextOverflowError`` for
    a window longer than the context, ``ConfigError`` for a text shorter than two windows."""
    if n_ctx > ctx.n_ctx:
        raise ContextOverflowError(f"a window of {n_ctx} exceeds the context of {ctx.n_ctx}")
    tokens = tokenize(text)
    windows = plan_windows(len(tokens), n_ctx)

    def work() -> PplAccumulator:
        acc = PplAccumulator()
        try:
            for w in windows:
                chunk = tokens[w.start : w.start + w.n_ctx]
                if bos is not None:
                    chunk = [bos, *chunk[1:]]
                ctx.clear()
                rows = ctx.decode_rows(chunk, 0, w.first)
                targets = chunk[w.first + 1 :]
                logp = log_softmax(rows[: w.n_scored])[np.arange(w.n_scored), targets]
                acc.add(float(x) for x in logp)
                if on_window is not None:
                    on_window(w, acc)
        finally:
            ctx.clear()
        return acc

    return engine.run_exclusive(work)
