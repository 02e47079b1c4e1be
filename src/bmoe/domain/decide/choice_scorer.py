"""The up-front choice checks and the first-token scoring of a decision.

A choice is scored by the log-probability of its first token over the whole vocabulary,
so two choices with the same first token cannot be told apart: such a list is refused
before anything is prefilled rather than answered with a tie.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.errors import ChoiceCollisionError, ChoiceError


def check_choices(choices: Sequence[str]) -> None:
    """Refuse an empty list or an empty choice (``ChoiceError``)."""
    if not choices:
        raise ChoiceError("empty choices list")
    for i, choice in enumerate(choices):
        if not choice:
            raise ChoiceError(f"empty choice at index {i}")


def first_tokens(choices: Sequence[str], tokenized: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The scored token of each choice: the first of its standalone tokenization.

    Raises ``ChoiceError`` for a choice that tokenizes to nothing and
    ``ChoiceCollisionError`` (naming the two indices) when two first tokens coincide.
    """
    check_choices(choices)
    firsts: list[int] = []
    seen: dict[int, int] = {}
    for i, (choice, tokens) in enumerate(zip(choices, tokenized, strict=True)):
        if not tokens:
            raise ChoiceError(f"choice {i} ({choice!r}) tokenizes to nothing")
        token = tokens[0]
        if token in seen:
            j = seen[token]
            raise ChoiceCollisionError(
                f"choices {j} ({choices[j]!r}) and {i} ({choice!r}) start with the same token "
                f"{token}, so their scores could not be told apart; use distinct first tokens "
                "(single-token labels such as A, B, C)",
                j,
                i,
                token,
            )
        seen[token] = i
        firsts.append(token)
    return tuple(firsts)


@attrs.frozen
class ChoiceScores:
    """``logp[i]``: log p of choice i's first token over the whole vocabulary; ``best``:
    the index of the highest (the first one on a tie)."""

    best: int
    logp: tuple[float, ...]


def score_choices(logits: npt.ArrayLike, tokens: Sequence[int]) -> ChoiceScores:
    """Score the first ``tokens`` of the choices against one row of logits."""
    if not tokens:
        raise ChoiceError("no choice to score")
    row = log_softmax(np.asarray(logits).reshape(-1))
    picked = row[np.asarray(tokens, dtype=np.int64)]
    return ChoiceScores(best=int(np.argmax(picked)), logp=tuple(float(v) for v in picked))
