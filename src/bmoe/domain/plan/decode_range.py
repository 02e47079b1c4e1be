"""A streamed decode's speed as a range: what the plan knows (the bytes a token routes to,
the disk, the compute) and what it can only bracket (the hit rate).

A streamed step reads the token's missed experts, then computes (the reads of one layer do
not overlap its compute: the layer waits for its experts), and the read lanes' own CPU work
(the kernel's ``O_DIRECT`` path, the repack of each expert as it lands, page faults) comes
out of the cores the compute threads use. So a step is

    resident step + MiB read / the disk's speed + MiB read x the CPU a MiB read costs

(``docs/benchmarks.md``, "Where a streamed step goes": this sum was 1.08-1.53x the first two
terms alone on a 2-core machine). The MiB read a token is one token's working set times the
misses; the misses are the one figure a header does not give, so the plan carries every
guess it has of the hit rate, each named (``HitGuess``): the uniform floor, the published
curve of the model's family, this model's usage profile, and what ``bmoe.plan --verify``
measured here. The range runs from the lowest guess to the highest; the estimate is the
best-informed guess (measured here, then the profile, then the floor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

MIB = 1 << 20


@attrs.frozen
class HitGuess:
    """One guess of the cache's hit rate, and where it comes from (a few words)."""

    name: str
    rate: float


@attrs.frozen
class DecodeFigures:
    """One hit rate's decode: bytes read a token, seconds a step, tokens a second."""

    hit_rate: float
    read_bytes: float
    step_s: float

    @property
    def tok_s(self) -> float:
        return 1.0 / self.step_s if self.step_s > 0 else math.inf


@attrs.frozen
class DecodeCosts:
    """What a streamed step costs beside its hit rate (module docstring):
    ``token_cycle_bytes`` (one token's working set), ``disk_mib_s``, ``resident_step_s``
    (the compute of a token with every expert in memory), ``cpu_s_per_mib`` (the step's
    cost per MiB read beyond the read itself) and where that last figure comes from."""

    token_cycle_bytes: int
    disk_mib_s: float
    resident_step_s: float
    cpu_s_per_mib: float
    cpu_source: str

    def at(self, hit_rate: float) -> DecodeFigures:
        read = self.token_cycle_bytes * (1.0 - hit_rate)
        mib = read / MIB
        disk = mib / self.disk_mib_s if self.disk_mib_s > 0 else math.inf
        return DecodeFigures(hit_rate, read, self.resident_step_s + disk + mib * self.cpu_s_per_mib)


@attrs.frozen
class DecodeRange:
    """The decode at every guess: ``low`` at the lowest hit rate (slowest), ``high`` at the
    highest, ``expected`` at the best-informed guess (``expected_guess``)."""

    guesses: tuple[HitGuess, ...]
    expected_guess: HitGuess
    low: DecodeFigures
    high: DecodeFigures
    expected: DecodeFigures


def decode_range(costs: DecodeCosts, guesses: Sequence[HitGuess], expected: HitGuess) -> DecodeRange:
    """The decode at the lowest, highest and expected guesses (``guesses`` not empty)."""
    lowest = min(guesses, key=lambda g: g.rate)
    highest = max(guesses, key=lambda g: g.rate)
    return DecodeRange(
        guesses=tuple(guesses),
        expected_guess=expected,
        low=costs.at(lowest.rate),
        high=costs.at(highest.rate),
        expected=costs.at(expected.rate),
    )
