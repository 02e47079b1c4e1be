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
