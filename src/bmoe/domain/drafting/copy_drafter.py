"""What to draft: the continuation of the longest earlier occurrence of the recent tokens.

Coding agents copy their context: an edit's ``old_str`` repeats lines of a file read
before, a patch repeats its context lines, a rewritten file most of itself. A reply that
copies can be verified many tokens at a time: the tokens the drafter proposes are decoded
with the current one in one batch, which reads the union of their experts once, and the
longest prefix the model itself would have chosen is kept.

``CopyDrafter`` indexes the token ids of the request's prompt and its output so far by
their ``min_match``-grams; ``propose()`` finds, among the earlier occurrences of the last
``min_match`` tokens, the one whose match runs back the longest, and proposes what followed
it (where the copy runs into the present, what followed repeats with the distance between
the two occurrences: a loop is drafted as a loop). Drafts are long (``min_draft`` to
``max_draft`` tokens) and only behind long matches: a
draft widens the verify batch, and on a MoE every extra row may read more experts. Its
length follows the acceptance seen so far in the request (doubled after a draft taken
whole, cut to twice what was taken otherwise). Pure policy: token ids in, token ids out.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bmoe.domain.drafting.draft_gate import DraftGate
from bmoe.domain.drafting.verify_cost import batch_price


@attrs.frozen
class DraftPolicy:
    """- ``min_match``: tokens that must repeat before anything is drafted;
    - ``min_draft`` / ``max_draft``: the bounds of a draft's length;
    - ``look_back``: the most recent earlier occurrences compared per step;
    - ``experts``: the model's routed experts a layer and how many a token uses, for the
      price of a verify batch (``verify_cost``; the session sets it from the model; (0, 0):
      no routed experts, a batch reads what a token reads)."""

    min_match: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    min_draft: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    max_draft: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    look_back: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    experts: tuple[int, int] = (0, 0)

    def price(self, rows: int) -> float:
        """A verify batch of ``rows`` rows' reads, in one-token steps."""
        return batch_price(rows, *self.experts)

    def gate(self) -> DraftGate:
        """A request's gate: paused drafting resumes behind twice the drafter's match."""
        return DraftGate(resume_match=2 * self.min_match, price=self.price)

    def __attrs_post_init__(self) -> None:
        if self.min_draft > self.max_draft:
            raise ValueError(f"min_draft {self.min_draft} > max_draft {self.max_draft}")


@attrs.frozen
class Draft:
    """Proposed ``tokens``, behind a match of ``match`` tokens (0 and () when none)."""

    tokens: tuple[int, ...] = ()
    match: int = 0


class CopyDrafter:
    """The request's tokens (prompt, then output as it comes) and their n-gram index."""

    def __init__(self, tokens: Sequence[int], policy: DraftPolicy | None = None) -> None:
        self.policy = policy or DraftPolicy()
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # gram -> indexes of its last token
        self.length = self.policy.min_draft  # the next draft's length, before the match caps it
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Add tokens (the prompt, or output as it is emitted)."""
        k = self.policy.min_match
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 1
            if end + 1 >= k:
                self._ends.setdefault(tuple(self.tokens[end + 1 - k : end + 1]), []).append(end)

    def _match_back(self, earlier: int) -> int:
        """How many tokens ending at ``earlier`` equal those ending at the last one."""
        last = len(self.tokens) - 1
        n = 0
        while earlier - n >= 0 and self.tokens[earlier - n] == self.tokens[last - n]:
            n += 1
        return n

    def propose(self, limit: int) -> Draft:
        """A draft of at most ``limit`` tokens (none where nothing long enough repeats)."""
        k = self.policy.min_match
        if limit <= 0 or len(self.tokens) < k + 1:
            return Draft()
        last = len(self.tokens) - 1
        ends = self._ends.get(tuple(self.tokens[last + 1 - k :]), [])
        best, best_at = 0, -1
        for earlier in reversed(ends[-self.policy.look_back - 1 :]):
            if earlier >= last:
                continue
            n = self._match_back(earlier)
            if n > best:
                best, best_at = n, earlier
        if best < k:
            return Draft()
        size = min(limit, self.length, max(self.policy.min_draft, 2 * best), self.policy.max_draft)
        period = last - best_at  # past the last token, what followed repeats with this period
        tokens = []
        for i in range(size):
            j = best_at + 1 + i
            while j > last:
                j -= period
            tokens.append(self.tokens[j])
        return Draft(tuple(tokens), best)

    def taken(self, drafted: int, accepted: int) -> None:
        """What the model kept of the last draft: the next draft's length follows it."""
        if drafted <= 0:
            return
        p = self.policy
        if accepted >= drafted:
            self.length = min(p.max_draft, 2 * self.length)
        else:
            self.length = max(p.min_draft, min(p.max_draft, 2 * accepted))


def accepted_prefix(draft: Sequence[int], choices: Sequence[int]) -> int:
    """How many of ``draft``'s tokens, from its first, equal ``choices``: the tokens the
    reply takes at those places (the model's, or a transcript's)."""
    n = 0
    while n < len(draft) and n < len(choices) and draft[n] == choices[n]:
        n += 1
    return n
