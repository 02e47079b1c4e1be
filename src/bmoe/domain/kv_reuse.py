"""How much of the context already in memory a new prompt can keep (KV prefix reuse)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def extends(tokens: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether ``tokens`` begin with the whole of ``prefix`` (equal included)."""
    return len(prefix) <= len(tokens) and tuple(tokens[: len(prefix)]) == tuple(prefix)


@attrs.frozen
class ReusePlan:
    """Keep ``keep`` tokens of the memory, prefill ``prompt[keep:]``.

    ``trim`` is true when the memory holds more than ``keep`` tokens, whose tail must be
    removed first.
    """

    keep: int
    trim: bool


def plan_reuse(in_memory: Sequence[int], prompt: Sequence[int]) -> ReusePlan:
    """Keep the longest common prefix, but always prefill at least the prompt's last token
    (its logits are what the next token is sampled from)."""
    keep = min(common_prefix_len(in_memory, prompt), max(len(prompt) - 1, 0))
    return ReusePlan(keep=keep, trim=len(in_memory) > keep)


def swa_prefix_usable(keep: int, pos_min: int, n_swa: int) -> bool:
    """Whether a sliding-window memory still holds the cells a kept prefix needs.

    ``pos_min`` is the oldest position the memory holds once the tail from ``keep`` on was
    removed (-1: nothing left). The next token (at position ``keep``) attends to the last
    ``n_swa`` positions; a memory whose oldest cell is at ``pos_min`` has pruned older ones.
    Conservative (as llama.cpp's server): usable when nothing is kept, when nothing was
    pruned, or when the oldest cell lies before ``keep - n_swa``.
    """
    if keep == 0 or n_swa <= 0 or pos_min == 0:
        return True
    if pos_min < 0:
        return False  # every kept cell was pruned
    return pos_min < keep - n_swa
