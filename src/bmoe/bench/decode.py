"""Teacher-forced decode: feed a fixed token sequence one ``llama_decode`` at a time.

Every configuration is fed the same tokens, so their routing, their reads and their greedy
choices (the argmax after each token) can be compared position by position. Only the steps
after ``warmup`` are timed. A run that prefilled a prompt first (:mod:`~bmoe.bench.prefill`)
starts the decode at the prompt's end: the same sequence, continued.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs


class Stepper(Protocol):
    """One loaded model and context (stock llama-cpp-python or a bmoe session)."""

    def step(self, token: int, pos: int) -> None:
        """Decode ``token`` at position ``pos`` (logits for it only)."""

    def argmax(self) -> int:
        """The greedy choice after the last step."""


@attrs.frozen
class Decode:
    """What a teacher-forced run measured."""

    argmax: list[int]  # the greedy choice after every fed token, warm-up included
    step_s: list[float]  # each measured step's wall time
    wall_s: float  # the measured steps' total wall time
    warmup: int  # warm-up steps actually run
    notes: list[str]

    @property
    def measured(self) -> int:
        return len(self.step_s)

    @property
    def tok_s(self) -> float:
        return self.measured / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_ms_median(self) -> float:
        return 1000 * statistics.median(self.step_s) if self.step_s else 0.0


def teacher_force(
    stepper: Stepper,
    tokens: Sequence[int],
    warmup: int,
    measure: int,
    *,
    max_seconds: float = float("inf"),
    on_token: Callable[[int], None] = lambda done: None,
    on_measure_start: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    start: int = 0,
) -> Decode:
    """Feed ``warmup`` tokens untimed, then ``measure`` timed, from ``tokens[start]`` on, each
    at its own position (``start`` > 0: the first ``start`` tokens were prefilled).

    ``max_seconds`` caps the warm-up and the measure, each (a configuration that thrashes
    may take minutes per token); a cut is said in ``notes``. ``on_token(done)`` follows each
    step (``done``: decode steps so far, the prefill not counted); ``on_measure_start`` runs
    once before the first timed step (counters snapshot).
    """
    if warmup < 0 or measure < 1 or start < 0:
        raise ValueError(f"need warmup >= 0, measure >= 1, start >= 0, got {warmup}, {measure}, {start}")
    if start + warmup + measure > len(tokens):
        raise ValueError(f"{start} + {warmup} + {measure} tokens asked, the sequence holds {len(tokens)}")
    notes: list[str] = []
    argmax: list[int] = []
    deadline = clock() + max_seconds
    done = 0
    while done < warmup:
        stepper.step(tokens[start + done], start + done)
        argmax.append(stepper.argmax())
        done += 1
        on_token(done)
        if clock() > deadline and done < warmup:
            notes.append(f"warm-up cut at {done} of {warmup} tokens by the time cap ({max_seconds:g} s)")
            break
    done_warmup = done
    on_measure_start()
    steps: list[float] = []
    t_start = clock()
    deadline = t_start + max_seconds
    for done in range(done_warmup, done_warmup + measure):
        pos = start + done
        t = clock()
        stepper.step(tokens[pos], pos)
        steps.append(clock() - t)
        argmax.append(stepper.argmax())  # outside the timed step
        on_token(done + 1)
        if clock() > deadline and len(steps) < measure:
            notes.append(
                f"measure cut at {len(steps)} of {measure} tokens by the time cap ({max_seconds:g} s)"
            )
            break
    wall = sum(steps)
    return Decode(argmax=argmax, step_s=steps, wall_s=wall, warmup=done_warmup, notes=notes)


class ParallelStepper(Protocol):
    """One loaded model and context holding several sequences."""

    def step_all(self, entries: Sequence[tuple[int, int, int]]) -> None:
        """One ``llama_decode`` of ``(token, position, sequence)`` entries, logits for each."""

    def argmax_row(self, row: int) -> int:
        """The greedy choice of output row ``row`` after the last step."""


@attrs.frozen
class ParallelDecode:
    """What a teacher-forced run of several sequences measured: every step decodes one token
    of each sequence in one ``llama_decode``."""

    argmax: list[list[int]]  # per sequence, the greedy choice after every fed token
    step_s: list[float]  # each measured step's wall time (one token of every sequence)
    wall_s: float
    warmup: int  # warm-up steps actually run
    notes: list[str]

    @property
    def sequences(self) -> int:
        return len(self.argmax)

    @property
    def measured(self) -> int:
        """Generated tokens measured: steps times sequences."""
        return len(self.step_s) * self.sequences

    @property
    def tok_s(self) -> float:
        """Aggregate: every sequence's tokens over the measured wall time."""
        return self.measured / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def seq_tok_s(self) -> float:
        """One sequence's rate (each gets one token per step)."""
        return len(self.step_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_ms_median(self) -> float:
        return 1000 * statistics.median(self.step_s) if self.step_s else 0.0


def teacher_force_parallel(
    stepper: ParallelStepper,
    texts: Sequence[Sequence[int]],
    warmup: int,
    measure: int,
    *,
    max_seconds: float = float("inf"),
    on_step: Callable[[int], None] = lambda done: None,
    on_measure_start: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    start: int = 0,
) -> ParallelDecode:
    """:func:`teacher_force` for several sequences at once: sequence ``s`` is fed
    ``texts[s]`` from ``texts[s][start]`` on, and each step is one ``llama_decode`` holding
    one token of every sequence, at the same position in each (``start`` > 0: every
    sequence's first ``start`` tokens were prefilled). ``on_step(done)`` follows each step."""
    if not texts:
        raise ValueError("need at least one sequence")
    if warmup < 0 or measure < 1 or start < 0:
        raise ValueError(f"need warmup >= 0, measure >= 1, start >= 0, got {warmup}, {measure}, {start}")
    short = min(len(t) for t in texts)
    if start + warmup + measure > short:
        raise ValueError(f"{start} + {warmup} + {measure} tokens asked, a sequence holds {short}")
    notes: list[str] = []
    argmax: list[list[int]] = [[] for _ in texts]

    def step(pos: int) -> float:
        t = clock()
        stepper.step_all([(text[pos], pos, s) for s, text in enumerate(texts)])
        spent = clock() - t
        for s, out in enumerate(argmax):  # outside the timed step
            out.append(stepper.argmax_row(s))
        return spent

    deadline = clock() + max_seconds
    done = 0
    while done < warmup:
        step(start + done)
        done += 1
        on_step(done)
        if clock() > deadline and done < warmup:
            notes.append(f"warm-up cut at {done} of {warmup} steps by the time cap ({max_seconds:g} s)")
            break
    done_warmup = done
    on_measure_start()
    steps: list[float] = []
    deadline = clock() + max_seconds
    for done in range(done_warmup, done_warmup + measure):
        steps.append(step(start + done))
        on_step(done + 1)
        if clock() > deadline and len(steps) < measure:
            notes.append(
                f"measure cut at {len(steps)} of {measure} steps by the time cap ({max_seconds:g} s)"
            )
            break
    return ParallelDecode(argmax=argmax, step_s=steps, wall_s=sum(steps), warmup=done_warmup, notes=notes)
