"""``IDecideProbe``: what the decide probe (``--decide-probe``) needs from an engine.

Policy (when a decision is observed, what its record holds, the lens math) lives in
``bmoe.domain.decide.probe`` and ``bmoe.service.decider``. The probe only observes the
prefills it is told to and writes what it is given; it never changes what the model
computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bmoe.domain.decide.probe import ProbeObservation, ProbeRecord


class IDecideProbe(Protocol):
    """Observes the prefills of a decision and appends one record per decision somewhere."""

    def begin(self) -> None:
        """Forget what the last decision left and observe the prefills from now on. Between
        prefills only; never fails."""
        ...

    def end(self) -> None:
        """Stop observing; what was observed stays readable. Never fails."""
        ...

    def observation(self, choice_tokens: Sequence[int]) -> ProbeObservation:
        """What was observed since ``begin``, with the output head's rows of
        ``choice_tokens``, numbered after the last one taken (from 0 per session). Raises
        ``ConfigError`` when the head rows cannot be read; nothing else changes."""
        ...

    def write(self, record: ProbeRecord) -> None:
        """Append ``record`` (one line, flushed). Raises ``ConfigError`` when it cannot be
        written; the next call tries again."""
        ...
