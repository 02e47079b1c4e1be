"""The events of ``GET /v1/bmoe/metrics``: values in, JSON out (no HTTP, no session).

``MonitorView`` is what the monitor (``bmoe.serve.monitor``) saw at one instant: the
request in flight or the last one, with its running figures. ``MetricsFeed`` is one
client's feed: it turns each view and expert-cache snapshot into an event, keeping the
heat of that client's grid between events (docs/server.md documents every field).

The grid: one string per streamed layer, one character per expert, a hex digit
``2 * heat + resident`` (``resident`` 1 where the expert is in the cache, ``heat`` 0..7 its
recent routing, scaled to the hottest expert of late: ``bmoe.domain.live.ExpertHeat``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from bmoe.domain.drafting import DraftReport
from bmoe.domain.live import HEAT_TOP, ExpertHeat, ExpertSnapshot, LiveTotals
from bmoe.domain.prompt_cache import PromptCache
from bmoe.domain.streaming.governor import BudgetChange

Json = dict[str, Any]
Kind = Literal["chat", "completion", "decide"]
Outcome = Literal["done", "cancelled", "error"]
MIN_INTERVAL_S = 0.1  # at most ten events a second per client
BUSY_TICK_S = 0.5  # a prefill or a decision: an event this often (no token tells of them)
IDLE_TICK_S = 1.0  # idle: an event a second as long as the grid is cooling down


@attrs.frozen
class RequestView:
    """One request as the monitor saw it."""

    number: int  # 1 for the server's first request
    kind: Kind
    elapsed_s: float
    totals: LiveTotals
    outcome: Outcome | None = None  # None while it runs
    prefill_done: int = 0
    prefill_total: int = 0
    prefill_s: float | None = None  # None until its first token

    @property
    def phase(self) -> Literal["prefill", "decode", "decide"]:
        if self.kind == "decide":
            return "decide"
        return "prefill" if self.prefill_s is None else "decode"


@attrs.frozen
class MonitorView:
    """The monitor at one instant: ``request`` is the one in flight (``outcome`` None) or
    the last one, None before the first."""

    finished: int
    request: RequestView | None = None

    @property
    def state(self) -> Literal["idle", "prefill", "decode", "decide"]:
        if self.request is None or self.request.outcome is not None:
            return "idle"
        return self.request.phase


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def request_body(r: RequestView) -> Json:
    t = r.totals
    return {
        "number": r.number,
        "kind": r.kind,
        "outcome": r.outcome,
        "elapsed_s": _round(r.elapsed_s),
        "tokens": t.tokens,
        "max_tokens": t.steps or None,
        "tok_s": _round(t.tok_s, 2),
        "prefill_done": r.prefill_done,
        "prefill_total": r.prefill_total,
        "prefill_s": _round(r.prefill_s),
        "hit_pct": _round(t.hit_pct, 2),
        "read_mib_per_token": _round(t.read_mib_per_token),
        "stall_ms_per_token": _round(t.stall_ms_per_token),
        "drafts": drafts_body(t.drafts),
    }


def drafts_body(d: DraftReport | None) -> Json | None:
    """What copy drafts did in the request so far (``--draft copy``); None where it is not
    drafted (drafting off, or a request drafts cannot serve)."""
    if d is None:
        return None
    return {
        "verifies": d.verifies,
        "drafted": d.drafted,
        "accepted": d.accepted,
        "tokens_per_verify": _round(d.per_verify, 2),
        "paused": d.paused,
    }


def grid_cells(snap: ExpertSnapshot, levels: list[int]) -> list[str]:
    """One string per streamed layer of ``snap``: ``2 * heat + resident`` per expert, hex."""
    n = snap.n_expert
    rows = []
    for layer in snap.layers:
        base = layer * n
        rows.append(
            "".join(
                format(2 * min(HEAT_TOP, levels[base + e]) + (1 if snap.resident[base + e] else 0), "x")
                for e in range(n)
            )
        )
    return rows


def governor_body(changes: Sequence[BudgetChange] | None) -> Json | None:
    """The memory-pressure governor: how many changes it made and the last one; None when
    it does not run."""
    if changes is None:
        return None
    last = changes[-1] if changes else None
    return {
        "changes": len(changes),
        "last": None
        if last is None
        else {"from_bytes": last.before, "to_bytes": last.after, "why": last.why},
    }


def cache_body(
    snap: ExpertSnapshot, levels: list[int], stale: bool, governor: Sequence[BudgetChange] | None = None
) -> Json:
    c = snap.counters
    requests = c.hits + c.misses
    return {
        "budget_bytes": c.budget_bytes,
        "resident_bytes": c.resident_bytes,
        "resident_experts": sum(1 for layer in snap.layers for f in snap.resident_row(layer) if f),
        "hit_pct": round(100.0 * c.hits / requests, 2) if requests else None,
        # the eviction rule in charge; --cache-policy adaptive: each ghost cache's hit % so far
        "rule": c.cache_rule or None,
        "ghost_hit_pct": {rule: round(pct, 2) for rule, pct in c.ghost_pcts().items()} or None,
        "bytes_read": c.bytes_read,
        "n_layer": snap.n_layer,
        "n_expert": snap.n_expert,
        "layers": list(snap.layers),
        "heat_top": HEAT_TOP,
        "cells": grid_cells(snap, levels),
        "stale": stale,
        "governor": governor_body(governor),
    }


def prompt_cache_body(cache: PromptCache) -> Json:
    """The prompt cache's fill and what it spared: states kept, their MiB, the states
    restored and the prompt tokens they held; with a disk tier (``--cache-disk``) the states
    written there, read back, and refused (corrupt, foreign)."""
    c = cache.counters
    body: Json = {
        "entries": len(cache),
        "mib": _round(cache.nbytes / (1 << 20)),
        "limit_mib": None if cache.limit_bytes is None else _round(cache.limit_bytes / (1 << 20)),
        "restored": c.restored,
        "tokens_restored": c.tokens_restored,
    }
    if cache.spill is not None:
        body["disk"] = {
            "entries": len(cache.spill.held()),
            "written": c.spilled,
            "read_back": c.unspilled,
            "refused": c.refused_spilled,
        }
    return body


def next_tick(view: MonitorView, cooling: bool) -> float | None:
    """How long a feed waits for news before it sends an event anyway: during a prefill
    or a decision (their progress tells no one), and while idle as long as the grid is
    cooling down; None: only news (a request, a token) wakes it."""
    if view.state in ("prefill", "decide"):
        return BUSY_TICK_S
    if view.state == "idle" and cooling:
        return IDLE_TICK_S
    return None


class MetricsFeed:
    """One client's events. ``streaming``: whether the session streams experts (a resident
    session has no cache: ``cache`` is null)."""

    def __init__(self, model: str, streaming: bool, half_life_s: float | None = None) -> None:
        self.model = model
        self.streaming = streaming
        self.heat = ExpertHeat() if half_life_s is None else ExpertHeat(half_life_s)
        self._snap: ExpertSnapshot | None = None
        self._levels: list[int] = []

    def event(
        self,
        view: MonitorView,
        snap: ExpertSnapshot | None,
        now: float,
        governor: Sequence[BudgetChange] | None = None,
        slots: tuple[int, int, int] = (1, 0, 0),
        prompt_cache: PromptCache | None = None,
    ) -> Json:
        """The event for ``view`` and the cache's ``snap`` taken at ``now`` (seconds, any
        clock that only goes forward); ``snap`` None: it could not be taken this time, the
        previous one is shown (``stale``). ``governor``: the memory-pressure governor's
        changes so far, None when it does not run. ``slots``: the parallel sequences
        (``-np``), those running a request now, the requests waiting for one. ``prompt_cache``:
        the conversations' states kept in memory (``--cache-ram``), None without one."""
        stale = snap is None and self._snap is not None
        if snap is not None:
            self._snap = snap
            self.heat.update(snap.routed, now)
            self._levels = self.heat.levels()
        cache = None
        if self.streaming and self._snap is not None:
            cache = cache_body(self._snap, self._levels, stale, governor)
        return {
            "model": self.model,
            "state": view.state,
            "requests": view.finished,
            "streaming": self.streaming,
            "request": None if view.request is None else request_body(view.request),
            "cache": cache,
            "slots": {"total": slots[0], "busy": slots[1], "waiting": slots[2]},
            "prompt_cache": None if prompt_cache is None else prompt_cache_body(prompt_cache),
        }

    @property
    def cooling(self) -> bool:
        """Whether the grid's heat is still decaying (worth an event while idle)."""
        return self.heat.warm()
