"""How far this machine's compute moves: the plan's prefill range carries it.

One calibration (``bmoe.runtime.compute_calibration``) times llama.cpp's kernels for a few
seconds; the tries within it move a few percent, but the same calibration a minute later can
move by a third on a shared or throttled machine (the 16-layer bench model's 2,048-token
prefill came out 33.0-49.4 s from seven calibrations here within an hour, the runs measured
33.3-44.1 s). So each calibration's speed (its measures' medians, summed) is kept in a short
history for this machine, its llama.cpp and the calibration's quantization and threads, and
the spread is the widest of the calibration's own tries and the history's fastest and
slowest against today's. Each record also keeps the prompt rates read from its timings (the
matmul curve, the attention rate: ``prompt_rates``), which move more than its total time;
the plan counts a prompt at each of them (``recent_rates``).
"""

from __future__ import annotations

import attrs

from bmoe.domain.plan.prompt_rates import PromptRates

KEPT = 24  # the newest calibrations kept for each key
MAX_AGE_S = 14 * 24 * 3600  # a machine changes (an update, a new llama.cpp): two weeks


@attrs.frozen
class CalibrationRecord:
    """One calibration: when (Unix seconds), what it ran on (``key``), its measures'
    medians summed (``seconds``: higher is slower), and the prompt rates read from them
    (empty and 0 in records kept before they were)."""

    at: float
    key: str
    seconds: float
    matmul_curve: tuple[tuple[float, float], ...] = ()
    attention_flops_s: float = 0.0

    @property
    def prompt_rates(self) -> PromptRates:
        return PromptRates(self.matmul_curve, self.attention_flops_s)


def spread_with_history(
    within: tuple[float, float], now: CalibrationRecord, history: tuple[CalibrationRecord, ...]
) -> tuple[float, float]:
    """``within`` (the calibration's fastest and slowest tries over its medians), widened
    to the history's fastest and slowest of ``now``'s key (within ``MAX_AGE_S``) over
    ``now``'s speed."""
    fast, slow = within
    if now.seconds <= 0:
        return within
    for record in kept(history, now.at, now.key):
        fast = min(fast, record.seconds / now.seconds)
        slow = max(slow, record.seconds / now.seconds)
    return (fast, slow)


def recent_rates(now: CalibrationRecord, history: tuple[CalibrationRecord, ...]) -> tuple[PromptRates, ...]:
    """The prompt rates of ``now``'s key's kept records (``kept``) that have a curve,
    oldest first."""
    return tuple(r.prompt_rates for r in kept(history, now.at, now.key) if r.matmul_curve)


def kept(history: tuple[CalibrationRecord, ...], at: float, key: str) -> tuple[CalibrationRecord, ...]:
    """The records of ``key`` no older than ``MAX_AGE_S`` at ``at``, the newest ``KEPT``."""
    same = [r for r in history if r.key == key and 0 <= at - r.at <= MAX_AGE_S and r.seconds > 0]
    return tuple(sorted(same, key=lambda r: r.at)[-KEPT:])


def with_record(
    history: tuple[CalibrationRecord, ...], record: CalibrationRecord
) -> tuple[CalibrationRecord, ...]:
    """The history to keep once ``record`` is added: every key's ``kept`` records (by the
    newest record's time)."""
    every = (*history, record)
    newest = max(r.at for r in every)
    keys = dict.fromkeys(r.key for r in every)
    return tuple(r for key in keys for r in kept(every, newest, key))
