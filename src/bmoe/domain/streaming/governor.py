"""The memory-pressure governor: when the expert cache's budget should shrink or grow.

``--cache-mb auto`` sizes the cache from the memory free at start. On a phone other apps take
that memory later, and the system kills the biggest process; on a PC memory freed later is
never used. The governor follows what the machine says about memory, reading by reading,
and moves the budget between a floor (the token cycle: below it the cache hits almost
nothing) and a ceiling (``--cache-ceil-mb``, or the budget ``auto`` chose at start):

- **a step down**, at once, when the process's own memory group hit its limit since the last
  reading (where that limit binds: the kernel reclaimed inside it, and the next allocation may
  be a kill), and growth never back to the budget that hit it;
- **shrink**, at once, when memory is short: the room left (``MemAvailable``, or what is left
  under the process's cgroup limit, whichever is less) falls below ``shrink_below_bytes``,
  or the kernel reports memory pressure (PSI ``some avg10`` at or above ``pressure_pct``:
  tasks stalled on memory). The budget drops below what the cache holds by enough to bring
  the room back to ``comfort_bytes`` (at least ``step_bytes``), never below the floor;
- **grow**, slowly, when memory is plentiful: the room stays above ``grow_above_bytes`` with
  no pressure for ``grow_after`` readings in a row, and not within ``cooldown`` readings of
  a shrink; each step adds at most ``step_bytes`` and never more than leaves the room at
  ``comfort_bytes``, up to the ceiling.

The room is counted in bytes, not as a share of the machine: ``--cache-mb auto`` keeps a
reserve beside the limit that binds (``domain.streaming.headroom``: a floor left to the
machine, or inside the process's own cgroup a margin sized from the run), of which the run
itself uses some (inside a cgroup about half: its reads in flight, its allocator), so the
comfort is half that reserve, a shrink starts at a quarter of it and growth above all of
it, a step at most half of it (``GovernorConfig.around``); a share would have the governor fight the budget
``auto`` chose on a large machine (20% of 24 GiB is 4.8 GiB that ``auto`` gave the cache),
and a fixed GiB would shrink at once a budget that leaves a 2 GiB cgroup 200 MiB.

A budget that shrinks evicts the coldest entries and gives their pages back (the engine does
that at the next decode boundary); one that grows only lets the cache fill again as tokens
route. The scheme follows the watermarks of an arena governor streaming experts in another
engine (shrink, comfort, grow), with PSI added as the earliest sign.

Pure: readings in, decisions out; ``adapters.memory_pressure`` reads the machine.
"""

from __future__ import annotations

import attrs

MIB = 1024 * 1024


@attrs.frozen
class MemoryReading:
    """What the machine said at one moment. ``room_bytes``: memory this process can still
    take (``MemAvailable``, lowered to what is left under its cgroup limit); ``usable_bytes``:
    all it could use (``MemTotal``, or the cgroup limit when lower); ``pressure_pct``: PSI
    ``some avg10`` of memory (the process's cgroup's where it has one, else the machine's),
    None where the kernel has no PSI; ``limit_hits``: the times the process's own group hit its
    limit since the last reading (v1 ``memory.failcnt``, v2 ``memory.events`` ``max``), where
    that limit binds: the kernel reclaimed in the group, the run is at its wall."""

    room_bytes: int
    usable_bytes: int
    pressure_pct: float | None = None
    limit_hits: int = 0

    @property
    def room_share(self) -> float:
        return self.room_bytes / self.usable_bytes if self.usable_bytes > 0 else 0.0


@attrs.frozen
class GovernorConfig:
    """Where the budget may move and what moves it (see the module docstring)."""

    floor_bytes: int
    ceil_bytes: int
    shrink_below_bytes: int = 512 * MIB
    comfort_bytes: int = 1024 * MIB
    grow_above_bytes: int = 2048 * MIB
    pressure_pct: float = 10.0
    step_bytes: int = 256 * MIB
    grow_after: int = 3
    cooldown: int = 10

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.floor_bytes <= self.ceil_bytes:
            raise ValueError(f"need 0 <= floor <= ceiling, got {self.floor_bytes} and {self.ceil_bytes}")
        if not 0 < self.shrink_below_bytes < self.comfort_bytes < self.grow_above_bytes:
            raise ValueError("need 0 < shrink_below_bytes < comfort_bytes < grow_above_bytes")
        if self.step_bytes <= 0 or self.grow_after < 1 or self.cooldown < 0:
            raise ValueError("need step_bytes > 0, grow_after >= 1 and cooldown >= 0")

    @classmethod
    def around(cls, reserve_bytes: int, *, floor_bytes: int, ceil_bytes: int) -> GovernorConfig:
        """Watermarks around the reserve ``auto`` kept (module docstring): comfort at half of
        it, a shrink below a quarter, growth above all of it, steps of at most half of it (and
        256 MiB)."""
        comfort = max(2 * MIB, reserve_bytes // 2)
        return cls(
            floor_bytes=floor_bytes,
            ceil_bytes=ceil_bytes,
            shrink_below_bytes=comfort // 2,
            comfort_bytes=comfort,
            grow_above_bytes=2 * comfort,
            step_bytes=min(256 * MIB, comfort),
        )


@attrs.frozen
class BudgetChange:
    """One decision: the budget from ``before`` to ``after`` bytes, and why, in words (the
    ``moe-governor:`` line)."""

    before: int
    after: int
    why: str

    @property
    def shrinks(self) -> bool:
        return self.after < self.before

    def text(self) -> str:
        return f"cache budget {self.before / MIB:,.0f} -> {self.after / MIB:,.0f} MiB: {self.why}"


@attrs.define
class MemoryGovernor:
    """Feed it a reading at a time with the budget in force and the bytes the cache holds;
    it answers a change or None."""

    config: GovernorConfig
    calm: int = 0  # readings in a row with room above grow_above and no pressure
    since_shrink: int = 1 << 30  # readings since the last shrink
    grow_cap: int | None = None  # growth stops below a budget that hit the group's limit

    def observe(self, reading: MemoryReading, budget_bytes: int, resident_bytes: int) -> BudgetChange | None:
        c = self.config
        self.since_shrink += 1
        pressed = reading.pressure_pct is not None and reading.pressure_pct >= c.pressure_pct
        short = reading.room_bytes < c.shrink_below_bytes
        if reading.limit_hits > 0:  # at the wall: a step down, and no growth back to it
            self.calm = 0
            after = max(c.floor_bytes, min(budget_bytes, resident_bytes) - c.step_bytes)
            self.grow_cap = after
            if after >= budget_bytes:
                return None
            self.since_shrink = 0
            return BudgetChange(
                budget_bytes, after, f"shrink: the memory group hit its limit {reading.limit_hits} times"
            )
        if pressed or short:
            self.calm = 0
            want = c.comfort_bytes - reading.room_bytes
            # what the cache holds is what a smaller budget gives back: shrink from there
            after = max(c.floor_bytes, min(budget_bytes, resident_bytes) - max(c.step_bytes, want))
            if after >= budget_bytes:
                return None
            self.since_shrink = 0
            why = (
                f"memory pressure {reading.pressure_pct:.1f}% (some avg10)"
                if pressed
                else f"{reading.room_bytes / MIB:,.0f} MiB free, {reading.room_share:.0%} of "
                f"{reading.usable_bytes / MIB:,.0f} MiB"
            )
            return BudgetChange(budget_bytes, after, "shrink: " + why)
        if reading.room_bytes <= c.grow_above_bytes:
            self.calm = 0
            return None
        self.calm += 1
        if self.calm < c.grow_after or self.since_shrink <= c.cooldown or budget_bytes >= c.ceil_bytes:
            return None
        spare = reading.room_bytes - c.comfort_bytes
        ceiling = c.ceil_bytes if self.grow_cap is None else min(c.ceil_bytes, self.grow_cap)
        after = min(ceiling, budget_bytes + min(c.step_bytes, spare))
        if after <= budget_bytes:
            return None
        self.calm = 0
        why = (
            f"grow: {reading.room_bytes / MIB:,.0f} MiB free ({reading.room_share:.0%}) for "
            f"{c.grow_after} readings"
        )
        return BudgetChange(budget_bytes, after, why)
