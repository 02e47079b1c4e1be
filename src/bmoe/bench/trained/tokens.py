"""Text to token ids with the tiny models' tokenizer, fast enough for megabytes, and the
held-out windows the figures and the check are computed on.

:func:`bmoe.tinymodel.tokenizer.encode` runs BPE on every word; here each distinct
pre-tokenized word is encoded once. The ids are ``encode``'s (no special tokens are parsed),
which on ASCII text are llama.cpp's.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from bmoe.tinymodel.tokenizer import encode, pretokenize

IDS = npt.NDArray[np.int32]


@functools.lru_cache(maxsize=1 << 18)
def _word_ids(word: str) -> tuple[int, ...]:
    return tuple(encode(word))


def tokenize(text: str) -> IDS:
    """``text`` as token ids."""
    ids: list[int] = []
    for word in pretokenize(text):
        ids.extend(_word_ids(word))
    return np.asarray(ids, dtype=np.int32)


def spread_windows(ids: IDS, length: int, count: int) -> IDS:
    """``count`` windows of ``length`` tokens, ``[count, length]``, their starts spread evenly
    over ``ids`` (as many as fit when ``ids`` is short, overlapping none)."""
    if length < 1 or count < 1:
        raise ValueError("need a positive window length and count")
    fit = len(ids) // length
    if fit == 0:
        raise ValueError(f"{len(ids)} tokens hold no window of {length}")
    count = min(count, fit)
    slots = np.linspace(0, fit - 1, count).round().astype(np.int64)
    return np.stack([ids[s * length : (s + 1) * length] for s in slots]).astype(np.int32)
