"""Log-probabilities from a row of logits (shared by decisions and perplexity).

Computed in float64 from the float32 logits llama.cpp returns, with the maximum taken out
first, so huge logits do not overflow and ``-inf`` logits (a masked token) give ``-inf``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Float64s = npt.NDArray[np.float64]


def log_softmax(logits: npt.ArrayLike) -> Float64s:
    """``logits - logsumexp(logits)`` over the last axis, as float64.

    A row whose logits are all ``-inf`` (no token possible) comes back all ``-inf``.
    """
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    # an all -inf row: log(0) = -inf, then -inf - -inf = nan, replaced by -inf below
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        out: Float64s = shifted - lse
    return np.where(np.isneginf(lse), -np.inf, out)


def renormalise(logp: npt.ArrayLike) -> Float64s:
    """Probabilities of a few log-probabilities, rescaled to sum to 1 over them alone.

    All zero when every entry is ``-inf`` (no mass to share).
    """
    x = np.asarray(logp, dtype=np.float64)
    if x.size == 0 or not np.any(x > -np.inf):
        return np.zeros_like(x)
    return np.exp(log_softmax(x))
