"""Whether drafting pays in this request: the tokens its verifies emitted, judged by stretches.

A verify decodes the current token and the draft in one batch. Streamed, that batch reads
the union of its rows' experts: where the draft is mostly rejected, the extra rows' reads
are paid for nothing, and a short draft on a MoE can cost more than it saves (the C++
engine's n-gram drafter lost 4-29% so). So the gate watches, per request, what each stretch
of ``window`` verifies emitted (the accepted draft tokens and the model's own next token);
a stretch that emitted fewer than ``min_per_verify`` tokens a verify pauses drafting, which
resumes only behind a match at least ``resume_match`` long (a long copy is where drafts pay
most).

The gate counts tokens, not seconds: a decision taken on measured time made the schedule of
batches depend on the machine's speed (the same request drafted 8 verifies resident and 6
streamed), and with it the last bits of the output; on tokens, streamed and resident verify
the same batches. Pure policy: counts in.
"""

from __future__ import annotations

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


class DraftGate:
    """Per request: ``allow(match)`` before proposing, ``verified(drafted, accepted)`` after
    each verify."""

    def __init__(self, resume_match: int = 16, window: int = 4, min_per_verify: float = 2.0) -> None:
        self.resume_match = resume_match
        self.window = window  # verifies judged together
        self.min_per_verify = min_per_verify
        self.report = DraftReport()
        self._stretch: list[int] = []  # tokens emitted by each verify of the stretch
        self.paused = False

    def allow(self, match: int) -> bool:
        if self.paused and match >= self.resume_match:
            self.paused = False
            self._stretch = []
        return not self.paused

    def verified(self, drafted: int, accepted: int) -> None:
        r = self.report
        r.verifies += 1
        r.drafted += drafted
        r.accepted += accepted
        self._stretch.append(accepted + 1)
        if len(self._stretch) < self.window:
            return
        emitted = sum(self._stretch)
        self._stretch = []
        if emitted < self.min_per_verify * self.window:
            self.paused = True
            r.paused += 1
