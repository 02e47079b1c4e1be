"""The governor at work: a thread that reads the machine's memory and moves a streamed
session's cache budget (``--cache-governor``; the policy is
:mod:`bmoe.domain.streaming.governor`, the readings :mod:`bmoe.adapters.memory_pressure`).

Each ``interval_s`` it takes a reading and, when the policy answers a change, sets the budget
without waiting: the change is applied at the next decode boundary (by the decoding thread
when its next decode starts, or by this thread at its next reading if no decode runs), so a
token's reads never see the budget move under them and the governor keeps reading while a
slow decode runs (waiting for the decode lock, it used to miss readings for seconds under
pressure). A budget someone else set (the user,
``Session.set_cache_budget`` or ``StreamingControl.set_budget``) is the ceiling from then on:
the governor may shrink it under pressure, never grow past it. Every change is kept in ``changes`` and
handed to ``on_change`` (the CLI prints it as a ``moe-governor:`` line). The thread stops
with the session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from bmoe.adapters.memory_pressure import MemoryProbe
from bmoe.domain.streaming.governor import BudgetChange, GovernorConfig, MemoryGovernor
from bmoe.runtime.streaming import StreamingControl

OnChange = Callable[[BudgetChange], None]


class CacheGovernor:
    """Moves ``control``'s budget as ``config`` says, from ``probe``'s readings."""

    def __init__(
        self,
        control: StreamingControl,
        config: GovernorConfig,
        probe: MemoryProbe | None = None,
        *,
        interval_s: float = 0.5,
        on_change: OnChange | None = None,
    ) -> None:
        self.control = control
        self.policy = MemoryGovernor(config)
        self.probe = probe or MemoryProbe()
        self.interval_s = interval_s
        self.on_change = on_change
        self.changes: list[BudgetChange] = []
        # told of every change too, on this thread (the prompt cache gives its room back)
        self.followers: list[OnChange] = []
        self._expected = control.counters().budget_bytes  # the budget as this governor left it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> BudgetChange | None:
        """One reading and, where the policy says so, the budget moved. None while a prompt
        holds the cache's room: its compute buffer was sized to fit the room and lowered the
        budget itself; the memory it takes goes back after it (the governor reads again then)."""
        self.control.settle()
        if self.control.prompt_holds_room:
            self.probe.read()  # the group's limit hits while a prompt runs are the prompt's
            return None
        reading = self.probe.read()
        budget = self.control.target_budget()
        if budget != self._expected:  # someone else set it: their ceiling
            self.set_ceiling(budget)
        change = self.policy.observe(reading, budget, self.control.counters().resident_bytes)
        if change is None:
            return None
        self._expected = change.after
        self.control.set_budget(change.after, wait=False)
        self.changes.append(change)
        for follower in self.followers:
            follower(change)
        if self.on_change is not None:
            self.on_change(change)
        return change

    def set_ceiling(self, ceil_bytes: int) -> None:
        """A budget the user set is the ceiling from then on: the governor may still shrink
        it under pressure, never grow past it."""
        self._expected = ceil_bytes
        c = self.policy.config
        self.policy.config = attrs.evolve(
            c, ceil_bytes=ceil_bytes, floor_bytes=min(c.floor_bytes, ceil_bytes)
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bmoe-cache-governor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.step()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
