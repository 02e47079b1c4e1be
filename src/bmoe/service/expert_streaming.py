"""``PolicyStreaming``: the streaming policy executed through an expert source.

Per MoE layer call, the routing goes to the domain policy (``ExpertCachePolicy``) and its
plan is carried out on an ``IExpertSource``: evicted entries are released, then the
misses are loaded and waited for, with the prefetched entries the layer routes to (their
reads adopted). In decode, with ``prefetch_depth`` > 0, the next layers' experts are then
read ahead (``PreviousTokenPrefetch``): the source issues them in the background. This is
the reference mode (``--stream-policy reference``) of the real engine (the C eval callback
hands each layer's ids here), and the seam every read-ahead policy is tested on with the
fake source.

With decode routing policies (``routing``: the stale-gate prediction, route-ahead, dropping,
substitution), a decode token's layer call also comes with its router (``IRouterView``):
``DecodeRouting`` decides before the request (the view then rewrites the ids and zeroes the
dropped slots' weights; dropped slots are not requested) and, after the load and the
previous-token reads ahead, plans the rankings' reads ahead, which the source issues.

Faults are sticky: after the first one (a failed read, or a routing the policy cannot
serve), ``fault()`` names it and every later ``route`` raises it without touching memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from bmoe.domain.streaming import (
    Entry,
    ExpertCachePolicy,
    GraphFault,
    LayerPlan,
    StreamCounters,
    StreamFault,
)
from bmoe.domain.streaming.cache_policy import DEFAULT_EVICTION, DEFAULT_HALF_LIFE, Eviction, PrefetchPlan
from bmoe.domain.streaming.decode_routing import (
    DecodeRouting,
    Routers,
    RouterScores,
    RoutingSettings,
    Scorer,
)
from bmoe.domain.streaming.prefetch import PreviousTokenPrefetch, next_moe_layer, prefill_reads_ahead
from bmoe.domain.streaming.victims import DEFAULT_VICTIMS, Victims, VictimsSetting
from bmoe.ports.expert_source import IExpertSource
from bmoe.ports.router_view import IRouterView


class PolicyStreaming:
    """Owns the policy; borrows the source (the caller closes it)."""

    def __init__(
        self,
        source: IExpertSource,
        budget_bytes: int,
        prefetch_depth: int = 0,
        prefill_ahead: bool = False,
        *,
        routing: RoutingSettings | None = None,
        routers: Routers | None = None,
        eviction: Eviction = DEFAULT_EVICTION,
        half_life: int = DEFAULT_HALF_LIFE,
        pass_layers: bool = False,
        victims: VictimsSetting = DEFAULT_VICTIMS,
    ) -> None:
        """``routing`` (with the ``routers`` it evaluates): the decode routing policies;
        None, or settings that are all off, for none. ``eviction``, ``half_life``: the cache's
        (``ExpertCachePolicy``). ``pass_layers``: a call of a layer the cache holds whole is
        passed (``ExpertCachePolicy.pass_layer``), unless decode routing policies run (they
        need every call)."""
        self.source = source
        sizes = [source.entry_bytes(layer) for layer in range(source.n_layer)]
        scope: Victims = "layer" if victims == "layer" else "global"  # auto: global first, a twin beside
        self.policy = ExpertCachePolicy(
            budget_bytes,
            sizes,
            source.n_expert,
            eviction=eviction,
            half_life=half_life,
            victims=scope,
            scope_twin=victims == "auto",
        )
        self.prefetcher = PreviousTokenPrefetch(prefetch_depth, sizes)
        self.prefill_ahead = prefill_ahead
        # a call of at most this many tokens is a decode step of that many sequences (one
        # token each): it counts as decode and reads no layer ahead (set between decodes)
        self.decode_rows = 1
        self.routing: DecodeRouting | None = None
        if routing is not None and routing.active:
            if routers is None:
                raise ValueError("the decode routing policies need the routers")
            self.routing = DecodeRouting(routing, routers, self.policy)
        self._routers_known = routers is not None
        self.pass_layers = pass_layers and self.routing is None
        self._graph_fault: GraphFault | None = None
        self.stall_s = 0.0
        self.mgmt_s = 0.0
        self.rank_s = 0.0
        self.issue_s = 0.0

    def fault(self) -> StreamFault | None:
        """The first fault, the source's or the routing's (sticky)."""
        return self._graph_fault or self.source.fault()

    def route(
        self, layer: int, experts: Iterable[int], n_tokens: int = 1, router: IRouterView | None = None
    ) -> LayerPlan | None:
        """Serve one MoE layer call of ``n_tokens`` tokens: on return, every expert it routes
        to is in memory (and, in decode, the next layers' reads ahead are issued). Raises
        ``StreamingFaultError`` (sticky) instead of returning with one absent. ``router``: a
        decode call's router, for the decode routing policies (without it they skip the
        call). None where the call was passed (``pass_layers``: the layer held whole, no
        request)."""
        t0 = time.perf_counter()
        rank0 = self.rank_s
        fault = self.fault()
        if fault is not None:
            raise fault.error()
        if self.pass_layers and self.policy.pass_layer(layer):
            self.mgmt_s += time.perf_counter() - t0
            return None
        ids = list(experts)
        routed = self.routing is not None and n_tokens == 1 and router is not None
        if routed:
            assert self.routing is not None and router is not None
            scorer = self._timed(router) if router.has_input() else None
            decided = self.routing.route(layer, ids, router.probs(), scorer)
            if decided.rewritten:
                router.write_ids(decided.ids)
            if any(decided.dropped):
                router.drop(decided.dropped)
            ids = decided.served
        batched = 1 < n_tokens <= self.decode_rows
        try:
            plan = self.policy.request(layer, ids, n_tokens, decode=True if batched else None)
        except ValueError as exc:
            self._graph_fault = GraphFault(layer, str(exc))
            raise self._graph_fault.error() from exc
        if routed:
            assert self.routing is not None
            self.routing.observe(len(plan.loads), len(plan.hits) + len(plan.loads))
        wait = 0.0
        try:
            self.source.release(plan.evictions)
            wait = self.source.load([*plan.adopted, *plan.loads])
            targets = self.prefetcher.after_request(layer, ids, n_tokens)
            n_routed = len(set(ids))
            whole_layer = prefill_reads_ahead(n_tokens, n_routed, self.policy.n_expert)
            if not batched and self.prefill_ahead and whole_layer:
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
            if routed:
                assert self.routing is not None
                t1 = time.perf_counter()
                ranked0 = self.rank_s
                self._issue(self.routing.reads_ahead(layer))
                self.issue_s += time.perf_counter() - t1 - (self.rank_s - ranked0)
        finally:
            self.stall_s += wait
            self.mgmt_s += time.perf_counter() - t0 - wait - (self.rank_s - rank0)
        return plan

    def _timed(self, router: IRouterView) -> Scorer:
        """``router.scores``, its time counted as ranking."""

        def scores(layer: int) -> RouterScores:
            t0 = time.perf_counter()
            try:
                return router.scores(layer)
            finally:
                self.rank_s += time.perf_counter() - t0

        return scores

    def _issue(self, plans: list[PrefetchPlan]) -> None:
        for early in plans:
            self.source.release(early.evictions)
            self.source.issue(early.issued)

    def read_ahead(self, layer: int, experts: Iterable[int]) -> int:
        """Read ``experts`` of ``layer`` ahead of need as a committed set (``prefetch`` with
        ``hot``), as the warm-up of a usage profile (``warm``: not counted as a prefetch):
        issued on the source, returns the number issued. Between decodes."""
        plan = self.policy.prefetch(layer, experts, hot=True, warm=True)
        self._issue([plan])
        return len(plan.issued)

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
            warm_issued=c.warm_issued,
            passed=c.passed,
            **self._rule_counters(),
            rank_s=self.rank_s,
            issue_s=self.issue_s,
            **self._routing_counters(),
        )

    def set_victims(self, victims: Victims) -> None:
        """``--cache-victims auto``'s choice, from the next request on."""
        self.policy.set_victims(victims)

    def _rule_counters(self) -> dict[str, Any]:
        """The rule in charge, the victims' scope (and its twin's figures, if any) and,
        adaptive, the chooser's switches and the ghosts' hits."""
        ghosts, chooser = self.policy.ghosts, self.policy.chooser
        twin = self.policy.twin_counters()
        scope = {
            "cache_rule": self.policy.rule,
            "cache_victims": self.policy.victims,
            "cross_evictions": self.policy.counters.cross_evictions,
            "twin_misses": twin.get("misses", 0),
            "twin_cross_evictions": twin.get("cross_evictions", 0),
        }
        if ghosts is None or chooser is None:
            return scope
        return {
            **scope,
            "rule_switches": chooser.switches,
            "ghost_wanted": ghosts.wanted,
            "ghost_lru_hits": ghosts.hits["lru"],
            "ghost_slru_hits": ghosts.hits["slru"],
            "ghost_lfu_hits": ghosts.hits["lfu"],
        }

    def _routing_counters(self) -> dict[str, Any]:
        """The decode routing fields of ``StreamCounters``, as the fast path fills them
        (per-layer prediction counts whenever the routers are known)."""
        n_layer = len(self.policy.entry_bytes)
        if self.routing is None:
            return {"predict_layers": ((0, 0),) * n_layer if self._routers_known else ()}
        r = self.routing.counters
        return {
            "decode_slots": r.decode_slots,
            "predict_layers": self.routing.predict_layers(n_layer),
            "route_ahead_committed": r.route_ahead_committed,
            "route_ahead_passed": r.route_ahead_passed,
            "route_ahead_slots": r.route_ahead_slots,
            "route_ahead_agree": r.route_ahead_agree,
            "dropped": r.dropped,
            "substituted": r.substituted,
            "watchdog_checks": r.watchdog_checks,
            "watchdog_trips": r.watchdog_trips,
            "predict_gate_open": r.predict_gate_open,
            "predict_gate_closed": r.predict_gate_closed,
        }
