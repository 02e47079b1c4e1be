"""How the C engine does its work, never what it decides: the A/B switches of benchmarks and
tests, as one value.

Every setting leaves the output and the cache's decisions as they are (the gates check each
against the default); they move only time between threads, and exist so that a benchmark can
measure what each mechanism buys (docs/benchmarks.md). Users never need them. They reach the
engine in one place: ``StreamConfig.engine`` (a developer-only field) or, where it is None,
:meth:`EngineOptions.from_environ` on the ``BMOE_*`` variables below; the streaming adapter
resolves the result for the machine (``rank_worker``, recycling), and the streamer takes it
once, at setup, with its other knobs (``StreamerSettings.engine``, ``ExpertStreamer.configure``).

=========================  ==========================================================  =========
variable                   what it switches                                            default
=========================  ==========================================================  =========
``BMOE_PROJECTION_WAITS``  ``1``: each node waits for the expert projection it reads;   ``1``
                           ``0``: a layer waits for all of them at its topk
``BMOE_ORPHAN_READS``      ``1``: a victim whose read still runs is left to its lane;   ``1``
                           ``0``: the eval thread waits for the read
``BMOE_RANK_WORKER``       ``1`` / ``0``: rankings on a worker thread or on the eval    by CPUs
                           thread (unset: where a CPU is free, ``rank_worker``)
``BMOE_PAGE_RECYCLE``      ``1``: evicted pages move under the next read's slices;      ``1``
                           ``0``: they go back to the kernel
``BMOE_PAGE_RELEASE``      when evicted pages go back: ``ahead`` (reads ahead's through ``ahead``
                           the release ring), ``all`` (every eviction's), ``inline``
``BMOE_REPACK_PARTS``      ``all``; ``dense`` or ``experts`` repack one part only (the  ``all``
                           output then matches no resident run: a measurement only)
``BMOE_READ_IN_PLACE``     ``1``: a projection that lands as read (no repack) is read   ``1``
                           straight into its slice's pages; ``0``: through a bounce
                           buffer, then copied
``BMOE_WAKE_LANES``        ``each``: one waiting worker woken a queued read; ``all``:   ``each``
                           every worker woken whenever reads are queued
``BMOE_EXPERT_ROWS``       ``own``: expert e's bytes in row e of its tensors;           ``own``
                           ``shuffled``: in a fixed permutation of the rows, the
                           routing ids rewritten to rows (the mechanism a slot-stable
                           cache needs, proven exact by the gates)
=========================  ==========================================================  =========
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, cast

import attrs

from bmoe.errors import ConfigError

PageRelease = Literal["inline", "ahead", "all"]
WakeLanes = Literal["each", "all"]
WAKE_LANES: tuple[WakeLanes, ...] = ("each", "all")
ExpertRows = Literal["own", "shuffled"]
EXPERT_ROWS: tuple[ExpertRows, ...] = ("own", "shuffled")
RepackParts = Literal["all", "dense", "experts"]
PAGE_RELEASES: tuple[PageRelease, ...] = ("inline", "ahead", "all")
REPACK_PARTS: tuple[RepackParts, ...] = ("all", "dense", "experts")

ENV_PROJECTION_WAITS = "BMOE_PROJECTION_WAITS"
ENV_ORPHAN_READS = "BMOE_ORPHAN_READS"
ENV_RANK_WORKER = "BMOE_RANK_WORKER"
ENV_PAGE_RECYCLE = "BMOE_PAGE_RECYCLE"
ENV_PAGE_RELEASE = "BMOE_PAGE_RELEASE"
ENV_REPACK_PARTS = "BMOE_REPACK_PARTS"
ENV_READ_IN_PLACE = "BMOE_READ_IN_PLACE"
ENV_WAKE_LANES = "BMOE_WAKE_LANES"
ENV_EXPERT_ROWS = "BMOE_EXPERT_ROWS"


@attrs.frozen
class EngineOptions:
    """The engine's A/B switches (module docstring). ``rank_worker`` None: decided by the
    CPUs (``bmoe.domain.streaming.rank_worker``). ``lane_delay_us``: tests only, the worker
    lanes sleep this long before each projection they read (a slow disk)."""

    projection_waits: bool = True
    orphan_reads: bool = True
    rank_worker: bool | None = None
    page_recycle: bool = True
    page_release: PageRelease = "ahead"
    repack_parts: RepackParts = "all"
    read_in_place: bool = True
    wake_lanes: WakeLanes = "each"
    expert_rows: ExpertRows = "own"
    lane_delay_us: int = 0

    def __attrs_post_init__(self) -> None:
        if self.page_release not in PAGE_RELEASES:
            choices = ", ".join(PAGE_RELEASES)
            raise ConfigError(f"page_release must be one of {choices}, not {self.page_release!r}")
        if self.repack_parts not in REPACK_PARTS:
            choices = ", ".join(REPACK_PARTS)
            raise ConfigError(f"repack_parts must be one of {choices}, not {self.repack_parts!r}")
        if self.wake_lanes not in WAKE_LANES:
            choices = ", ".join(WAKE_LANES)
            raise ConfigError(f"wake_lanes must be one of {choices}, not {self.wake_lanes!r}")
        if self.expert_rows not in EXPERT_ROWS:
            choices = ", ".join(EXPERT_ROWS)
            raise ConfigError(f"expert_rows must be one of {choices}, not {self.expert_rows!r}")
        if self.lane_delay_us < 0:
            raise ConfigError(f"lane_delay_us must be >= 0, not {self.lane_delay_us}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> EngineOptions:
        """The options the ``BMOE_*`` variables set (unset ones keep their default); a value
        that is not one of a variable's choices is a ConfigError naming it."""
        return cls(
            projection_waits=_flag(environ, ENV_PROJECTION_WAITS) is not False,
            orphan_reads=_flag(environ, ENV_ORPHAN_READS) is not False,
            rank_worker=_flag(environ, ENV_RANK_WORKER),
            page_recycle=_flag(environ, ENV_PAGE_RECYCLE) is not False,
            page_release=cast(PageRelease, _choice(environ, ENV_PAGE_RELEASE, PAGE_RELEASES) or "ahead"),
            repack_parts=cast(RepackParts, _choice(environ, ENV_REPACK_PARTS, REPACK_PARTS) or "all"),
            read_in_place=_flag(environ, ENV_READ_IN_PLACE) is not False,
            wake_lanes=cast(WakeLanes, _choice(environ, ENV_WAKE_LANES, WAKE_LANES) or "each"),
            expert_rows=cast(ExpertRows, _choice(environ, ENV_EXPERT_ROWS, EXPERT_ROWS) or "own"),
        )


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    """``1`` True, ``0`` False, unset None."""
    value = environ.get(name)
    if not value:
        return None
    if value not in ("0", "1"):
        raise ConfigError(f"{name} must be 1 or 0, not {value!r}")
    return value == "1"


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    """One of ``choices``, unset None."""
    value = environ.get(name)
    if not value:
        return None
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value
