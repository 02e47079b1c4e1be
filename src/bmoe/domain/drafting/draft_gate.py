"""Whether drafting pays in this request: each verify judged against its price in reads.

A verify decodes the current token and the draft in one batch. On a MoE that batch reads
the union of its rows' experts: a draft of ``d`` tokens costs about ``batch_price(d + 1)``
one-token steps of reads (``verify_cost``: up to every expert of a layer), and pays only
where it emits at least that many tokens (the accepted ones and the model's own next). A
short draft mostly rejected costs more than it saves (the C++ engine's n-gram drafter lost
4-29% so; bmoe's first gate, which judged stretches of four verifies at two tokens a verify,
let a text with no copies lose 4% of its speed and read 8% more on the trained bench model).

So the gate judges every verify: one that did not pay its price pauses drafting until a
match of ``resume_match`` tokens, and each further one that does not pay doubles the match
asked for (a text whose short repeats are chance stops drafting for all but long copies);
one that pays sets the match back to the drafter's own minimum.

The gate counts tokens, not seconds or bytes: a decision taken on measured time or reads
made the schedule of batches depend on the machine's speed and the cache's state (the same
request drafted 8 verifies resident and 6 streamed), and with it the last bits of the
output; on tokens and the model's shape, streamed and resident verify the same batches.
Pure policy: counts in.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.define
class DraftReport:
    """What drafting did in one request: ``verifies`` (batches of a token and its draft),
    ``drafted`` tokens proposed, ``accepted`` of them kept, ``paused`` times the gate
    stopped drafting."""

    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    paused: int = 0

    @property
    def per_verify(self) -> float:
        """Tokens emitted per verify: the accepted draft tokens and the model's own next one."""
        return (self.accepted + self.verifies) / self.verifies if self.verifies else 0.0


def _rows(rows: int) -> float:
    return float(rows)  # no model shape given: every row priced as a step of its own


class DraftGate:
    """Per request: ``allow(match)`` before proposing, ``verified(drafted, accepted)`` after
    each verify. ``price(rows)``: a verify batch's reads in one-token steps
    (``verify_cost.batch_price`` of the model's experts)."""

    MOST_MATCH = 1024  # the doubling stops here

    def __init__(self, resume_match: int = 16, price: Callable[[int], float] = _rows) -> None:
        self.resume_match = resume_match
        self.price = price
        self.report = DraftReport()
        self.asked = 0  # the match drafting waits for; 0: any the drafter proposes behind
        self.paused = False

    def allow(self, match: int) -> bool:
        if self.paused and match >= self.asked:
            self.paused = False
        return not self.paused

    def verified(self, drafted: int, accepted: int) -> None:
        r = self.report
        r.verifies += 1
        r.drafted += drafted
        r.accepted += accepted
        if accepted + 1 >= self.price(drafted + 1):
            self.asked = 0
            return
        self.asked = min(self.MOST_MATCH, 2 * self.asked if self.asked else self.resume_match)
        self.paused = True
        r.paused += 1
