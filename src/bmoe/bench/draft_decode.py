"""Teacher-forced decode with copy drafts: a fixed token sequence fed as ``--draft copy``
would feed a reply that is exactly that sequence.

At each step the current token goes into the KV alone, or with a draft that
:class:`~bmoe.domain.drafting.CopyDrafter` proposes from everything fed so far, verified in
one batch with logits for every row, as the session's drafting loop
(``bmoe.service.copy_drafts``) does with the same drafter and gate. The difference is the
acceptance: here a drafted token is kept where it equals the sequence's next token (the
reply is the transcript's, "teacher-forced acceptance"), where a session keeps it where it
equals the model's own choice. Rejected rows are cut from the KV. What is measured is what
drafting costs and saves on a reply that copies as the transcript does: the wall time, and
(streamed) the expert reads of every verify batch, whose union the streamer reads once.

The greedy choice after every fed token is kept too (the argmax of each verified row up to
the kept ones), so a run with drafts compares position by position with one without: a
difference is a near-tie that the batch's kernels decided otherwise.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from bmoe.domain.drafting import CopyDrafter, DraftPolicy, DraftReport, accepted_prefix


class DraftStepper(Protocol):
    """A loaded model and context that can verify a batch and drop its tail."""

    def step(self, token: int, pos: int) -> None:
        """Decode ``token`` at position ``pos`` (logits for it only)."""

    def argmax(self) -> int:
        """The greedy choice after the last step."""

    def step_rows(self, tokens: Sequence[int], pos: int) -> np.ndarray[Any, Any]:
        """Decode ``tokens`` from position ``pos`` in one batch; every row's logits."""

    def cut(self, keep: int) -> None:
        """Drop every position from ``keep`` on."""


@attrs.frozen
class DraftedDecode:
    """What a teacher-forced run with drafts measured (``measured``: tokens emitted, the
    positions the run advanced; ``step_s``: each plain step's or verify's wall time)."""

    argmax: list[int]
    step_s: list[float]
    measured: int
    drafts: DraftReport
    notes: list[str]
    warmup: int = 0  # plain steps fed before the measure

    @property
    def step_ms_median(self) -> float:
        return 1000 * statistics.median(self.step_s) if self.step_s else 0.0

    @property
    def wall_s(self) -> float:
        return sum(self.step_s)

    @property
    def tok_s(self) -> float:
        return self.measured / self.wall_s if self.wall_s > 0 else 0.0


def teacher_force_drafted(
    stepper: DraftStepper,
    tokens: Sequence[int],
    start: int,
    measure: int,
    policy: DraftPolicy,
    *,
    warmup: int = 0,
    max_seconds: float = float("inf"),
    on_token: Callable[[int], None] = lambda done: None,
    on_measure_start: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> DraftedDecode:
    """Feed ``warmup`` tokens from ``tokens[start]`` on in plain steps, untimed (the first
    ``start`` are in the KV already), then ``measure`` tokens drafting from ``tokens[: pos +
    1]`` at each position ``pos``, as :func:`~bmoe.bench.decode.teacher_force` feeds them
    without drafts. ``on_token(done)`` follows each step or verify with the tokens fed so
    far (warm-up included); ``on_measure_start`` runs once before the measure."""
    if start < 0 or warmup < 0 or measure < 1 or start + warmup + measure > len(tokens):
        raise ValueError(f"{start} + {warmup} + {measure} tokens asked, the sequence holds {len(tokens)}")
    argmax: list[int] = []
    for pos in range(start, start + warmup):
        stepper.step(tokens[pos], pos)
        argmax.append(stepper.argmax())
        on_token(pos + 1 - start)
    on_measure_start()
    start += warmup
    drafter = CopyDrafter(tokens[: start + 1], policy)
    gate = policy.gate()
    end = start + measure
    pos = start
    steps: list[float] = []
    notes: list[str] = []
    deadline = clock() + max_seconds
    while pos < end:
        draft = drafter.propose(end - pos - 1)
        if draft.tokens and gate.allow(draft.match):
            t = clock()
            rows = stepper.step_rows([tokens[pos], *draft.tokens], pos)
            choices = [int(c) for c in np.argmax(rows, axis=-1)]
            accepted = accepted_prefix(draft.tokens, tokens[pos + 1 :])  # teacher-forced
            stepper.cut(pos + 1 + accepted)
            steps.append(clock() - t)
            gate.verified(len(draft.tokens), accepted)
            drafter.taken(len(draft.tokens), accepted)
            argmax += choices[: accepted + 1]
            emitted = accepted + 1
        else:
            t = clock()
            stepper.step(tokens[pos], pos)
            steps.append(clock() - t)
            argmax.append(stepper.argmax())
            emitted = 1
        drafter.extend(tokens[pos + 1 : pos + 1 + emitted])
        pos += emitted
        on_token(pos - start + warmup)
        if clock() > deadline and pos < end:
            notes.append(
                f"measure cut at {pos - start} of {measure} tokens by the time cap ({max_seconds:g} s)"
            )
            break
    return DraftedDecode(argmax, steps, pos - start, gate.report, notes, warmup)
