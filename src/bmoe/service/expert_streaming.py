"""``PolicyStreaming``: the streaming policy executed through an expert source.

Per MoE layer call, the routing goes to the domain policy (``ExpertCachePolicy``) and its
plan is carried out on an ``IExpertSource``: evicted entries are released, then the
misses are loaded and waited for, with the prefetched entries the layer routes to (their
reads adopted). In decode, with ``prefetch_depth`` > 0, the next layers' experts are then
read ahead (``PreviousTokenPrefetch``): the source issues them in the background. This is
the reference mode (``--stream-policy reference``) of the real engine (the C eval callback
hands each layer's ids here), and the seam every read-ahead policy is tested on with the
fake source.

Faults are sticky: after the first one (a failed read, or a routing the policy cannot
serve), ``fault()`` names it and every later ``route`` raises it without touching memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from bmoe.domain.streaming import (
    Entry,
    ExpertCachePolicy,
    GraphFault,
    LayerPlan,
    StreamCounters,
    StreamFault,
)
from bmoe.domain.streaming.prefetch import PreviousTokenPrefetch, next_moe_layer, prefill_reads_ahead
from bmoe.ports.expert_source import IExpertSource


class PolicyStreaming:
    """Owns the policy; borrows the source (the caller closes it)."""

    def __init__(
        self, source: IExpertSource, budget_bytes: int, prefetch_depth: int = 0, prefill_ahead: bool = False
    ) -> None:
        self.source = source
        sizes = [source.entry_bytes(layer) for layer in range(source.n_layer)]
        self.policy = ExpertCachePolicy(budget_bytes, sizes, source.n_expert)
        self.prefetcher = PreviousTokenPrefetch(prefetch_depth, sizes)
        self.prefill_ahead = prefill_ahead
        self._graph_fault: GraphFault | None = None
        self.stall_s = 0.0
        self.mgmt_s = 0.0

    def fault(self) -> StreamFault | None:
        """The first fault, the source's or the routing's (sticky)."""
        return self._graph_fault or self.source.fault()

    def route(self, layer: int, experts: Iterable[int], n_tokens: int = 1) -> LayerPlan:
        """Serve one MoE layer call of ``n_tokens`` tokens: on return, every expert it routes
        to is in memory (and, in decode, the next layers' reads ahead are issued). Raises
        ``StreamingFaultError`` (sticky) instead of returning with one absent."""
        t0 = time.perf_counter()
        fault = self.fault()
        if fault is not None:
            raise fault.error()
        ids = list(experts)
        try:
            plan = self.policy.request(layer, ids, n_tokens)
        except ValueError as exc:
            self._graph_fault = GraphFault(layer, str(exc))
            raise self._graph_fault.error() from exc
        wait = 0.0
        try:
            self.source.release(plan.evictions)
            wait = self.source.load([*plan.adopted, *plan.loads])
            targets = self.prefetcher.after_request(layer, ids, n_tokens)
            n_routed = len(set(ids))
            if self.prefill_ahead and prefill_reads_ahead(n_tokens, n_routed, self.policy.n_expert):
                ahead = next_moe_layer(layer, self.policy.entry_bytes)
                if ahead is not None:
                    targets = [(ahead, list(range(self.policy.n_expert)))]
            for ahead, ahead_ids in targets:
                try:
                    early = self.policy.prefetch(ahead, ahead_ids)
                except ValueError as exc:
                    self._graph_fault = GraphFault(ahead, str(exc))
                    raise self._graph_fault.error() from exc
                self.source.release(early.evictions)
                self.source.issue(early.issued)
        finally:
            self.stall_s += wait
            self.mgmt_s += time.perf_counter() - t0 - wait
        return plan

    def set_budget(self, budget_bytes: int) -> tuple[Entry, ...]:
        """Change the budget between decodes; evicts in eviction order down to it."""
        evicted = self.policy.set_budget(budget_bytes)
        self.source.release(evicted)
        return evicted

    def evict_all(self) -> tuple[Entry, ...]:
        evicted = self.policy.evict_all()
        self.source.release(evicted)
        return evicted

    def resident(self) -> list[Entry]:
        return self.policy.resident()

    def counters(self) -> StreamCounters:
        c = self.policy.counters
        return StreamCounters(
            requests=c.requests,
            hits=c.hits,
            misses=c.misses,
            evictions=c.evictions,
            rereads=c.rereads,
            bytes_read=c.bytes_read,
            io_s=self.stall_s,  # the port does not report the lanes' busy time
            mgmt_s=self.mgmt_s,
            resident_bytes=self.policy.resident_bytes,
            budget_bytes=self.policy.budget_bytes,
            stall_s=self.stall_s,
            prefetch_issued=c.prefetch_issued,
            prefetch_hits=c.prefetch_hits,
            prefetch_wasted=c.prefetch_wasted,
        )
