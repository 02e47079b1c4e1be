"""Where a decision's prefix ends, found on tokens, never on text.

The prompt is the chat template rendered over ``prefix + suffix`` as one user message;
the prefix is also rendered alone. The two token sequences agree up to the join, and the
kept state covers that common part less one token: a tokenizer merge across the join
can make the last token that looks shared a different token once the text goes on (the
next request's longer prefix), and a kept state must be a prefix of what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.domain.kv_reuse import common_prefix_len


def split_prefix(full: Sequence[int], prefix_alone: Sequence[int]) -> int:
    """Number of leading tokens of ``full`` that belong to the prefix state.

    The common prefix of ``full`` and ``prefix_alone``, less one token given back, and never
    all of ``full``: at least one token is prefilled, whose logits are the answer.
    """
    shared = common_prefix_len(full, prefix_alone)
    return max(0, min(shared - 1, len(full) - 1))
