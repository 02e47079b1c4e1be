"""The expert cache's budget at start: ``--cache-mb auto`` from the memory room, and an
explicit budget checked against it.

The room is read once the session's context exists and the dense part is copied in
(``ExpertStreaming.attach``). What the run takes beside the cache is then of two kinds:

- already in memory, so already out of the room: the dense part (copied into anonymous
  pages, ``dense_bytes``) and the KV cache (llama.cpp clears its buffer when it creates the
  context, which touches every page, ``kv_bytes``);
- still to come: llama.cpp's compute buffer (reserved at creation, touched only as ubatches
  run, so the room does not show it yet, ``compute_buffer_bytes``) and the prompt cache's
  memory tier (``--cache-ram``: conversations' states kept as the context changes hands,
  ``prompt_states_bytes``). Only these are subtracted, with a reserve beside the limit that
  binds (``domain.streaming.headroom``: a floor left to the machine, or inside the process's
  own cgroup a margin sized from the run, ``run_margin_bytes``).

So each is counted once, and the room *before* this run took anything is
``room + dense + KV``: the figure an explicit budget is held against, in the user's terms
(budget + dense + KV + compute buffer against the room).
"""

from __future__ import annotations

import attrs

from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.streaming.config import MIB, StreamConfig
from bmoe.domain.streaming.headroom import Headroom, run_margin_bytes


@attrs.frozen
class RunMemory:
    """The memory figures the budget is set from (see the module docstring)."""

    room: MemoryRoom  # as read once the dense part and the KV cache were in memory
    dense_bytes: int = 0  # in memory already: in the room's reading
    kv_bytes: int = 0  # in memory already: in the room's reading
    compute_buffer_bytes: int = 0  # reserved, not touched yet: still to come
    prompt_states_bytes: int = 0  # the prompt cache's memory tier (--cache-ram): still to come
    run_margin_bytes: int = run_margin_bytes(1, 0)  # kept in the run's own cgroup (headroom)

    def __attrs_post_init__(self) -> None:
        for name in ("dense_bytes", "kv_bytes", "compute_buffer_bytes", "prompt_states_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")

    @property
    def room_before_bytes(self) -> int:
        """The room before this run took anything: what it read, plus what it already held."""
        return self.room.room_bytes + self.dense_bytes + self.kv_bytes

    @property
    def cache_fits_bytes(self) -> int:
        """The most the expert cache can take: the room less the compute buffer still to come."""
        return max(0, self.room.room_bytes - self.compute_buffer_bytes)

    @property
    def headroom(self) -> Headroom:
        """The limit that binds ``auto`` and the reserve it keeps beside it."""
        return Headroom.of(self.room, run_margin=self.run_margin_bytes)

    @property
    def still_to_come_bytes(self) -> int:
        """What the run takes after the room was read: the compute buffer and the prompt states."""
        return self.compute_buffer_bytes + self.prompt_states_bytes


@attrs.frozen
class Budget:
    """The budget chosen at start. ``warning``: a line for the user (an explicit budget below
    one token cycle, or one that does not fit in the room). ``compute_buffer_bytes``: what
    ``auto`` subtracted for llama.cpp's compute buffer (0 for a budget given in MiB).
    ``memory``: the figures it was set from (None where none were read)."""

    bytes: int
    auto: bool
    warning: str | None = None
    compute_buffer_bytes: int = 0
    memory: RunMemory | None = None
    overruled: str = ""  # what overruled auto's arithmetic: --cache-ceil-mb, or the token cycle
    # the least the run holds it to later (the governor, the room read again): one token
    # cycle, or two layers where the budget is below the cycle (the room held no more)
    floor_bytes: int = 0

    def arithmetic(self) -> str:
        """How ``auto`` came to its figure, for the ``mode:`` line: ``auto = room 1811 -
        compute buffer 87.0 - 84 MiB kept free in the cgroup; the room: under a cgroup
        limit of 2048 MiB, after dense 180 + KV 384 MiB`` (and ``- prompt cache 512`` where
        ``--cache-ram`` keeps states in memory)."""
        m = self.memory
        if m is None:
            return f"auto, compute buffer {self.compute_buffer_bytes / MIB:.1f} MiB subtracted"
        head = m.headroom
        states = f" - prompt cache {m.prompt_states_bytes / MIB:.0f}" if m.prompt_states_bytes else ""
        compute = f"compute buffer {m.compute_buffer_bytes / MIB:.1f}"
        parts = [f"auto = room {head.room_bytes / MIB:.0f} - {compute}{states} - {head.describe()}"]
        if self.overruled:
            parts.append(self.overruled)
        held = f"dense {m.dense_bytes / MIB:.0f} + KV {m.kv_bytes / MIB:.0f} MiB"
        parts.append(f"the room: {m.room.describe()}, after {held}")
        return "; ".join(parts)


def resolve_budget(
    config: StreamConfig, *, memory: RunMemory, token_cycle_bytes: int, least_bytes: int = 0
) -> Budget:
    """The cache budget in bytes.

    ``auto`` is the room less ``memory.compute_buffer_bytes`` (the compute buffer is
    allocated when the context is created but touched only as ubatches run, and it grows with
    the ubatch: the 5.2 GiB bench model 11 MiB at ``-b 64``, 89 MiB at ``-b 512``), less the
    prompt cache's memory tier, and less the reserve of the limit that binds
    (``domain.streaming.headroom``), capped by ``cache_ceil_mb``. A budget given in MiB is taken
    as given; where it and the compute buffer exceed the room, a warning says so with the
    figures and what would fit.

    ``token_cycle_bytes`` (the sum over layers of k expert slices) is the least useful
    cache: below it an LRU on routing that repeats hits almost never, so a smaller budget
    gets a warning (but is honoured). ``auto`` is raised to one cycle where the room holds
    it (``least_auto_bytes``), never beyond a memory cgroup's room: measured, the 48-layer
    bench model at ``-c 4096`` in 2 GiB, its budget raised to the cycle (972 MiB) past what
    the room left, was killed by its first prompt ubatch. ``least_bytes`` is the least it
    takes all the same: two layers' k experts, which a step holds while it computes one and
    reads the next.
    """
    if config.cache_mb is not None:
        budget = config.cache_mb * MIB
        warnings = []
        if 0 < budget < token_cycle_bytes:
            warnings.append(below_working_set(config.cache_mb, token_cycle_bytes))
        if budget > memory.cache_fits_bytes:
            warnings.append(does_not_fit(config.cache_mb, memory))
        warning = "; ".join(warnings) or None
        return Budget(budget, auto=False, warning=warning, memory=memory, floor_bytes=token_cycle_bytes)
    budget = max(0, memory.headroom.free_bytes - memory.still_to_come_bytes)
    overruled = ""
    if config.cache_ceil_mb is not None and budget > config.cache_ceil_mb * MIB:
        budget, overruled = config.cache_ceil_mb * MIB, f"capped at --cache-ceil-mb {config.cache_ceil_mb}"
    warning = None
    if budget < token_cycle_bytes:
        raised = least_auto_bytes(memory, token_cycle_bytes, least_bytes)
        warning = short_of_cycle(budget, raised, token_cycle_bytes, memory)
        if raised > budget:
            budget = raised
            overruled = "raised to one token cycle" if raised >= token_cycle_bytes else "raised to two layers"
        else:
            overruled = "below one token cycle: the room holds no more"
    return Budget(
        budget,
        auto=True,
        warning=warning,
        compute_buffer_bytes=memory.compute_buffer_bytes,
        memory=memory,
        overruled=overruled,
        floor_bytes=token_cycle_bytes if budget >= token_cycle_bytes else least_bytes,
    )


def least_auto_bytes(memory: RunMemory, token_cycle_bytes: int, least_bytes: int) -> int:
    """The least ``auto`` takes where the room leaves it less than one token cycle: the cycle
    as far as the room itself holds it (the machine's floor is a reserve for others, which a
    cycle may take; a cgroup's margin is this run's own, which it may not), at least two layers."""
    head = memory.headroom
    holds = head.free_bytes if head.limit == "cgroup" else head.room_bytes
    return max(least_bytes, min(token_cycle_bytes, max(0, holds - memory.still_to_come_bytes)))


def short_of_cycle(room_leaves: int, taken: int, token_cycle_bytes: int, memory: RunMemory) -> str:
    """The warning for an ``auto`` budget below one token cycle, or raised past the room to
    reach it (``taken``, where the room leaves ``room_leaves``)."""
    cycle, kv = token_cycle_bytes / MIB, memory.kv_bytes / MIB
    more = f"a smaller -c (the KV cache takes {kv:.0f} MiB) or more memory would"
    if taken > room_leaves:
        return (
            f"the room leaves the cache {room_leaves / MIB:.0f} MiB, below one token's working set "
            f"({cycle:.0f} MiB); it takes {taken / MIB:.0f} MiB all the same: the run may be killed "
            f"for memory; {more} fit"
        )
    return (
        f"the room leaves the cache {taken / MIB:.0f} MiB, below one token's working set "
        f"({cycle:.0f} MiB): the cache cycles, expect few hits; {more} hold it"
    )


def does_not_fit(cache_mb: int, memory: RunMemory) -> str:
    """The warning for an explicit budget larger than the room leaves it, with the figures."""
    m = memory
    total = cache_mb * MIB + m.dense_bytes + m.kv_bytes + m.compute_buffer_bytes
    return (
        f"cache {cache_mb} MiB + dense {m.dense_bytes / MIB:.0f} + KV {m.kv_bytes / MIB:.0f} "
        f"+ compute buffer {m.compute_buffer_bytes / MIB:.1f} = {total / MIB:.0f} MiB, more than "
        f"the room of {m.room_before_bytes / MIB:.0f} MiB ({m.room.describe()}): the kernel may "
        f"kill the process; at most --cache-mb {m.cache_fits_bytes // MIB} fits "
        f"(--cache-mb auto: {m.headroom.describe()} besides)"
    )


def below_working_set(cache_mb: int, token_cycle_bytes: int) -> str:
    """The warning for a budget below one token's working set (the token cycle): every token
    evicts what the last one read, so the cache cycles (``python -m bmoe.plan`` says it so)."""
    return (
        f"cache {cache_mb} MiB is below one token's working set ({token_cycle_bytes / MIB:.0f} MiB, "
        f"every MoE layer's top-k experts: --cache-mb {-(-token_cycle_bytes // MIB)} holds it): "
        "the cache cycles, expect few hits"
    )
