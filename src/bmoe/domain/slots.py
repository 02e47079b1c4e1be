"""What each parallel sequence (a slot, ``-np N``) still holds after its request, and which
slot a new request takes (llama.cpp's server rules).

A slot whose request ended keeps its KV: the tokens of its prompt (its reply's cells are cut,
as they were computed one per step and the next turn computes them in a batch, as a fresh
server does; a recurrent memory, which cannot cut, keeps the reply it fed too).
A new request takes the free slot whose held tokens share the longest prefix with its
prompt when that prefix is at least ``similarity`` of the prompt (``--slot-prompt-similarity``,
llama.cpp's 0.1), keeping that prefix and prefilling the rest; otherwise the free slot
holding nothing, else the one used least recently (what it held is dropped). A held slot's
cells count against the context: when a request needs room, idle slots drop what they hold,
least recently used first.

Pure: tokens in, choices out.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bmoe.domain.kv_reuse import common_prefix_len

DEFAULT_SIMILARITY = 0.1


@attrs.frozen
class SlotChoice:
    """Take ``seq``, keep its first ``keep`` held tokens (0: start empty)."""

    seq: int
    keep: int


@attrs.define
class SlotMemory:
    """The tokens each of ``n_seq`` sequences holds, and when each was last used."""

    n_seq: int
    held: list[tuple[int, ...]] = attrs.field(init=False)
    last_used: list[int] = attrs.field(init=False)
    _clock: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if self.n_seq < 1:
            raise ValueError("n_seq must be >= 1")
        self.held = [() for _ in range(self.n_seq)]
        self.last_used = [0] * self.n_seq

    def pick(
        self, prompt: Sequence[int], free: Sequence[int], similarity: float = DEFAULT_SIMILARITY
    ) -> SlotChoice:
        """The slot a request with ``prompt`` takes among ``free`` (not empty), and how much
        of it to keep (never the whole prompt: its last token is prefilled for its logits)."""
        if not free:
            raise ValueError("no free slot")
        prompt = tuple(prompt)
        shared = {seq: common_prefix_len(self.held[seq], prompt) for seq in free}
        best = max(free, key=lambda seq: (shared[seq], -self.last_used[seq]))
        if prompt and shared[best] > 0 and shared[best] >= similarity * len(prompt):
            return SlotChoice(best, min(shared[best], len(prompt) - 1))
        empty = [seq for seq in free if not self.held[seq]]
        if empty:
            return SlotChoice(empty[0], 0)
        return SlotChoice(min(free, key=lambda seq: self.last_used[seq]), 0)

    def hold(self, seq: int, tokens: Sequence[int]) -> None:
        """``seq`` holds ``tokens`` now (a request ended, or one starts on them)."""
        self._clock += 1
        self.held[seq] = tuple(tokens)
        self.last_used[seq] = self._clock

    def forget(self, seq: int) -> None:
        """``seq`` holds nothing (its cells were dropped)."""
        self.held[seq] = ()

    def cells(self, seqs: Sequence[int]) -> int:
        """The cells ``seqs`` hold."""
        return sum(len(self.held[seq]) for seq in seqs)

    def to_drop(self, idle: Sequence[int]) -> list[int]:
        """The ``idle`` slots that hold something, least recently used first: the order in
        which they give their cells back when a request needs room."""
        return sorted((seq for seq in idle if self.held[seq]), key=lambda seq: self.last_used[seq])
