"""What ``python -m bmoe.plan --verify`` measured of a model here, and how the next plan of
that model predicts from it.

A verify run decodes (and prefills) with the plan's own flags and keeps, beside the figures it
measured, the figures the plan had used (the disk's speed, the resident step, the prefill
it predicted). From the two the next plan takes:

- **the hit rate** at its own cache share: the measured one where the shares agree (within
  ``SAME_SHARE``); elsewhere scaled by the reference the plan has at both shares (this
  model's usage profile where there is one, else the share itself: a cache twice the size
  hits about twice as often until it saturates), never above 1;
- **the CPU a MiB read costs a step**: what the measured step was beyond the plan's resident
  step and its reads at the disk's speed, per MiB read;
- **the prefill**: the measured time, carried to another prompt length by the ratio of the
  plan's own arithmetic at the two lengths, today's calibration at both (a prompt's compute
  rate timed again varies by a third from one plan to the next: a correction factor on
  today's figure would carry that noise, a ratio of two of today's figures cancels it).

Where several runs were kept, the one whose cache share is nearest the plan's serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

MIB = 1 << 20
SAME_SHARE = 0.02  # of every expert: cache shares this close are the same cache
KEPT_RUNS = 16  # runs kept a model, the newest


@attrs.frozen
class VerifiedRun:
    """One verify run: the cache's share of the experts, and what it measured (``hit_rate``,
    ``read_mib_token``, ``tok_s``; ``prefill_tokens``/``prefill_s``, 0 where none ran), and
    what the plan had used (``disk_mib_s``, ``resident_step_s``).
    ``where``: the memory limit and the disk as the run had them, for the user."""

    cache_share: float
    hit_rate: float
    read_mib_token: float
    tok_s: float
    disk_mib_s: float
    resident_step_s: float
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    where: str = ""

    @property
    def cpu_s_per_mib(self) -> float:
        """The step beyond the resident step and the reads at the disk's speed, per MiB read
        (never below 0; 0 where nothing was read)."""
        if self.read_mib_token <= 0 or self.tok_s <= 0:
            return 0.0
        reads = self.read_mib_token / self.disk_mib_s if self.disk_mib_s > 0 else 0.0
        return max(0.0, 1.0 / self.tok_s - self.resident_step_s - reads) / self.read_mib_token


def nearest(runs: Sequence[VerifiedRun], share: float) -> VerifiedRun | None:
    """The run whose cache share is nearest ``share`` (the newest among equals)."""
    if not runs:
        return None
    return min(reversed(runs), key=lambda r: abs(r.cache_share - share))


def hit_rate_at(run: VerifiedRun, share: float, reference: Callable[[float], float] | None) -> float:
    """The run's hit rate carried to a cache of ``share`` (module docstring)."""
    if abs(run.cache_share - share) <= SAME_SHARE:
        return run.hit_rate
    ref = reference if reference is not None else (lambda s: min(1.0, s))
    at_run, at_share = ref(run.cache_share), ref(share)
    if at_run <= 0:
        return run.hit_rate
    return max(0.0, min(1.0, run.hit_rate * at_share / at_run))


def prefill_run(runs: Sequence[VerifiedRun], share: float, tokens: int) -> VerifiedRun | None:
    """The run with a measured prefill nearest in cache share, then in prompt length."""
    measured = [r for r in runs if r.prefill_s > 0 and r.prefill_tokens > 0]
    if not measured:
        return None
    return min(
        reversed(measured),
        key=lambda r: (round(abs(r.cache_share - share), 2), abs(r.prefill_tokens - tokens)),
    )


def kept(runs: Sequence[VerifiedRun], new: VerifiedRun) -> tuple[VerifiedRun, ...]:
    """The runs to keep once ``new`` is measured: the newest ``KEPT_RUNS``, one a cache share
    and place (``new`` replaces an older run of the same share measured where it was)."""
    others = [
        r for r in runs if not (abs(r.cache_share - new.cache_share) <= SAME_SHARE and r.where == new.where)
    ]
    return (*others, new)[-KEPT_RUNS:]
