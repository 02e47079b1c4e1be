"""``StreamingControl``: one session's expert streaming, fast path or reference policy.

Wires what ``ExpertStreaming.attach`` set up to one of the two ways of serving a layer:

- ``fast``: the C callback plans with its cache core and reads on its lanes;
- ``reference``: the C callback hands each layer's ids to ``PolicyStreaming`` (the domain
  policy), whose plan is executed through ``LaneExpertSource`` (the expert-source port);
  with decode routing policies, a decode token's layer call also hands over its router
  (``StreamerRouterView``), and ``DecodeRouting`` decides what the fast path's C code does.

Both are set up from one value, ``StreamerSettings`` (``settings``: built from the
``StreamConfig`` and the engine options ``attach`` resolved): the C streamer takes it in one
call (``ExpertStreamer.configure``), the reference policy its fields. Both give bit-identical
output and equal counters (the gates run both). ``lock`` is held
around every ``llama_decode``, so
``set_budget`` and ``close`` from another thread wait for the decode in flight and act at
its boundary, never while the C callback walks the cache (the control itself is the context
manager the context enters). A budget set while a decode runs
is also left *pending*, and the decoding thread applies it when it enters its next
decode: ``threading.Lock`` is not fair, and a thread that decodes token after token takes
it back within microseconds, so a waiter could miss boundary after boundary (measured: a
governor's shrink landed up to 7 s after it was decided, under memory pressure).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from bmoe.adapters.compute_buffer import release_compute_buffer
from bmoe.adapters.expert_source import LaneExpertSource
from bmoe.adapters.expert_streaming import ExpertStreaming, StreamingInfo
from bmoe.adapters.process_usage import faults_and_system
from bmoe.adapters.router_view import StreamerRouterView
from bmoe.adapters.stream_trace import TraceFiles
from bmoe.cext import expert_stream
from bmoe.domain.live import ExpertSnapshot
from bmoe.domain.streaming import Entry, StreamConfig, StreamCounters, StreamFault
from bmoe.domain.streaming.decode_routing import Routers
from bmoe.domain.streaming.prefill_memory import LEND_FROM_TOKENS, PrefillLending, PromptBatch
from bmoe.domain.streaming.streamer_settings import StreamerSettings
from bmoe.errors import StreamingFaultError
from bmoe.runtime.victims_control import VictimsControl
from bmoe.service.expert_streaming import PolicyStreaming


class StreamingControl:
    def __init__(self, streaming: ExpertStreaming, config: StreamConfig) -> None:
        self.streaming = streaming
        self.info: StreamingInfo = streaming.info
        self.lock = threading.Lock()
        self._pending_budget: int | None = None  # set while a decode ran; applied at a boundary
        self._pending_lock = threading.Lock()
        self._closed = False
        self._reference: PolicyStreaming | None = None
        self._router_view: StreamerRouterView | None = None
        self._traces: TraceFiles | None = None
        self._turn = 0
        self._lending: PrefillLending | None = None  # the cache lends a prompt-sized ubatch its room
        self._release_compute = False  # give the compute buffer's pages back before the next decode
        self.compute_released_bytes = 0  # ... given back so far
        # auto only: after a prompt, the budget it returns to held to the room read again
        # (``prefill_memory.budget_held_to_room``): (budget, resident) -> budget
        self.after_prompt: Callable[[int, int], int] | None = None
        self.prompt_batch: PromptBatch | None = None  # chosen from the room when the session opened
        streamer = streaming.streamer
        self._layers = tuple(layer for layer in range(streamer.n_layer) if streamer.entry_bytes(layer) > 0)
        # the setup knobs, one value for the C streamer and the reference policy alike
        self.settings = settings = StreamerSettings.of(config, streaming.engine)
        if settings.victims != "global" and not self.info.rows:  # its graph gathers by expert id
            self.settings = settings = attrs.evolve(settings, victims="global")
        if config.policy == "reference":
            streamer.configure(settings.for_reference())  # the decisions are the policy's
            self._source = LaneExpertSource(
                streamer,
                streaming.read_paths,
                self.info.lanes,
                streaming.tensor_at,
            )
            routers = None
            if settings.routing.active:
                routers = Routers(streamer.router_k, streamer.gating, frozenset(streamer.gate_layers()))
                streamer.reference_routing = True
                self._router_view = StreamerRouterView(streamer)
            self._reference = PolicyStreaming(
                self._source,
                self.info.budget.bytes,
                settings.prefetch_k,
                settings.prefill_ahead,
                routing=settings.routing,
                routers=routers,
                eviction=settings.eviction,
                half_life=settings.half_life,
                victims=settings.victims,
                pass_layers=settings.pass_layers,
            )
            streamer.set_reference_hook(self._serve)
            streamer.mode = expert_stream.MODE_REFERENCE
        else:
            streamer.configure(settings)
            if config.route_trace is not None or config.io_trace is not None:
                self._traces = TraceFiles(
                    streamer,
                    [streamer.entry_bytes(layer) for layer in range(streamer.n_layer)],
                    None if config.route_trace is None else Path(config.route_trace),
                    None if config.io_trace is None else Path(config.io_trace),
                )
            streamer.mode = expert_stream.MODE_STREAM
        self._victims: VictimsControl | None = None  # --cache-victims auto
        if settings.victims == "auto":
            target = self._reference if self._reference is not None else streamer
            counters = self._reference.counters if self._reference is not None else streaming.counters
            self._victims = VictimsControl(counters, target)

    def _serve(self, layer: int, ids: list[int], n_tokens: int) -> int:
        """The C callback's reference hook: 1 once every routed expert is in memory, 2 where
        the policy passed the call (the layer held whole), 0 on a fault."""
        assert self._reference is not None
        try:
            plan = self._reference.route(layer, ids, n_tokens, self._router_view if n_tokens == 1 else None)
        except StreamingFaultError:
            return 0
        return 2 if plan is None else 1

    # -- figures ---------------------------------------------------------------------------

    def end_turn(self) -> None:
        """After each request: write its rows to the trace files (if any)."""
        self._turn += 1
        if self._traces is not None:
            with self.lock:
                self._traces.drain(self._turn)

    def counters(self) -> StreamCounters:
        """The cache's counters, with the process's minor faults and system time so far."""
        counters = self._reference.counters() if self._reference is not None else self.streaming.counters()
        faults, system_s = faults_and_system()
        switches = self._victims.chooser.switches if self._victims is not None else 0
        return attrs.evolve(counters, minor_faults=faults, system_s=system_s, victims_switches=switches)

    def resident_entries(self) -> list[Entry]:
        """Resident entries in eviction order (the next to go first)."""
        if self._reference is not None:
            return self._reference.resident()
        return list(self.streaming.streamer.resident_entries())

    def snapshot(self, timeout: float) -> ExpertSnapshot | None:
        """The expert cache now (residency, routing counts, counters), from any thread:
        taken under ``lock``, so it waits for the decode in flight (at most ``timeout``
        seconds) and holds the next one back only for two copies. None when the lock did
        not come in time or the streaming is closed."""
        if not self.lock.acquire(timeout=timeout):
            return None
        try:
            if self._closed:
                return None
            streamer = self.streaming.streamer
            resident, routed = streamer.expert_snapshot()
            n_layer, n_expert = streamer.n_layer, streamer.n_expert
            if self._reference is not None:  # the reference policy keeps its own residency
                flags = bytearray(n_layer * n_expert)
                for layer, expert in self._reference.resident():
                    flags[layer * n_expert + expert] = 1
                resident = bytes(flags)
            counters = self.counters()
        finally:
            self.lock.release()
        counts = memoryview(routed).cast("q").tolist()
        return ExpertSnapshot(n_layer, n_expert, self._layers, resident, tuple(counts), counters)

    # -- faults ----------------------------------------------------------------------------

    def fault(self) -> StreamFault | None:
        """The first fault (sticky): a failed read, a routing it cannot serve, or a model
        file replaced or truncated under the session."""
        if self._reference is not None:
            fault = self._reference.fault()
            if fault is not None:
                return fault
        return self.streaming.fault()

    def check(self) -> None:
        """Raise the fault as a ``StreamingFaultError`` (``ExpertReadError``,
        ``ExpertGraphError``), if there is one."""
        fault = self.fault()
        if fault is not None:
            raise fault.error()

    # -- control (any thread) --------------------------------------------------------------

    def set_budget(self, budget_bytes: int, *, wait: bool = True) -> None:
        """Change the cache budget at the next decode boundary; evicts in eviction order down
        to it. It is left pending, then applied here once no decode runs (``wait``: this
        waits for the decode in flight; without, it returns at once) or by the next decode
        when it starts, whichever comes first. Without ``wait``, call ``settle`` later: a
        budget left pending while no decode follows is applied there."""
        with self._pending_lock:
            lending = self._lending
            if lending is not None and lending.lent:  # the budget to return to; now, what a prompt leaves
                budget_bytes = lending.set_while_lent(budget_bytes)
            self._pending_budget = budget_bytes
        self._apply_when_free(wait)

    def settle(self) -> None:
        """Apply a budget left pending if no decode runs now (never waits)."""
        if self._pending_budget is not None:
            self._apply_when_free(False)

    def target_budget(self) -> int:
        """The budget as last set: the one left pending, if any, else the one in force; while
        a prompt borrows the cache's room, the one it returns to after."""
        with self._pending_lock:
            pending = self._pending_budget
            lending = self._lending
            if lending is not None and lending.lent_from is not None:
                return lending.lent_from
        return pending if pending is not None else self.counters().budget_bytes

    @property
    def prompt_holds_room(self) -> bool:
        """A prompt-sized ubatch borrowed the cache's room and has not given it back yet."""
        lending = self._lending
        return lending is not None and lending.lent

    def _apply_when_free(self, wait: bool) -> None:
        if self.lock.acquire(blocking=wait):
            try:
                self._apply_pending_budget()
            finally:
                self.lock.release()

    def _apply_pending_budget(self) -> None:
        """The budget left pending, if any (``lock`` held)."""
        with self._pending_lock:
            budget, self._pending_budget = self._pending_budget, None
        if budget is None or self._closed:
            return
        if self._reference is not None:
            self._reference.set_budget(budget)
        else:
            self.streaming.streamer.set_budget(budget)

    def lend_to_prompts(self, lending: PrefillLending) -> None:
        """From now on a prompt-sized ubatch borrows the cache's room and the compute buffer's
        pages go back after it (``before_decode``; ``bmoe.domain.streaming.prefill_memory``)."""
        self._lending = lending

    @property
    def lending(self) -> PrefillLending | None:
        return self._lending

    def before_decode(self, n_tokens: int) -> None:
        """``ctx.before_decode``: a ``llama_decode`` of ``n_tokens`` comes. A prompt-sized
        one lowers the budget by its compute buffer (left pending, applied as it enters the
        lock); the first decode step after it gives the compute buffer's pages back and the
        budget returns. Under ``--cache-victims auto``, a window of decode steps may end here
        (``victims_control``)."""
        if self._victims is not None:
            self._victims.before_decode(n_tokens <= max(1, self.streaming.streamer.decode_rows))
        lending = self._lending
        if lending is None or (n_tokens <= LEND_FROM_TOKENS and not lending.lent):
            return
        budget = self.target_budget()
        with self._pending_lock:
            lend = lending.before(n_tokens, budget)
            if lend.release:
                self._release_compute = True
            if lend.budget is not None:
                self._pending_budget = lend.budget

    def give_back_compute(self) -> int:
        """llama.cpp's compute buffer's pages back to the system now (waits for a decode in
        flight); the bytes given back (the pages a graph touched and the untouched alike)."""
        with self.lock:
            return self._give_back_compute()

    def _give_back_compute(self) -> int:
        """``give_back_compute`` with ``lock`` held (no decode running)."""
        self._release_compute = False
        if self._closed:
            return 0
        given = release_compute_buffer(self.streaming.streamer.compute_buffer)
        self.compute_released_bytes += given
        return given

    def __enter__(self) -> StreamingControl:
        """What the context holds around each ``llama_decode`` (``ctx.decode_lock``): ``lock``,
        then the compute buffer given back if a prompt borrowed the cache's room, then a
        budget left pending applied."""
        self.lock.acquire()
        try:
            if self._release_compute:
                self._give_back_compute()
                self._hold_to_room()
            self._apply_pending_budget()
        except BaseException:
            self.lock.release()
            raise
        return self

    def _hold_to_room(self) -> None:
        """After a prompt gave the compute buffer back (``lock`` held): the budget it returns
        to, held to what the room now leaves (``after_prompt``, auto only)."""
        with self._pending_lock:
            back = self._pending_budget
        if back is None or self.after_prompt is None:
            return
        held = self.after_prompt(back, self.counters().resident_bytes)
        with self._pending_lock:
            if self._pending_budget == back:  # nobody set another meanwhile
                self._pending_budget = held

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def read_ahead(self, targets: Sequence[tuple[int, Sequence[int]]]) -> int:
        """Read ``[(layer, experts)]`` ahead of need, in that order, as committed sets (the
        warm-up of a usage profile): queued on the lanes at the next decode boundary,
        returns at once with the number of entries issued (the reference policy issues them
        on its source's pool). A request adopts those it routes to."""
        issued = 0
        with self.lock:
            if self._closed:
                return 0
            for layer, experts in targets:
                if self._reference is not None:
                    issued += self._reference.read_ahead(layer, experts)
                else:
                    issued += self.streaming.streamer.read_ahead(layer, experts, True, True)
        return issued

    def set_decode_rows(self, n: int) -> None:
        """The next graph calls of at most ``n`` tokens are decode steps of ``n`` sequences
        (1: one sequence). Between decodes (the caller holds the session's turn)."""
        if self._reference is not None:
            self._reference.decode_rows = max(1, n)
        self.streaming.streamer.decode_rows = n

    def evict_all(self) -> None:
        with self.lock:
            if self._reference is not None:
                self._reference.evict_all()
            else:
                self.streaming.streamer.evict_all()

    def close(self) -> None:
        """Release the lanes, descriptors and buffers now (waits for a decode in flight)."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self._traces is not None:
                self._traces.drain(self._turn + 1)
                self._traces.close()
            if self._reference is not None:
                self._source.close()
            else:
                self.streaming.streamer.close()
