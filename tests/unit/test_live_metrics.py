"""The live metrics feed's pure parts: a request's running figures, the heat of the expert
grid, the events ``GET /v1/bmoe/metrics`` sends (field by field, as docs/server.md says),
and the monitor the worker's thread feeds."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import attrs
import numpy as np
import pytest

from bmoe.domain.drafting import DraftReport
from bmoe.domain.generation import Progress
from bmoe.domain.live import ExpertHeat, ExpertSnapshot, LiveTotals, heat_levels
from bmoe.domain.prompt_cache import PromptCache
from bmoe.domain.streaming import MIB, StreamCounters
from bmoe.domain.streaming.governor import BudgetChange
from bmoe.serve.errors import RequestCancelledError
from bmoe.serve.live import (
    BUSY_TICK_S,
    IDLE_TICK_S,
    MetricsFeed,
    MonitorView,
    RequestView,
    grid_cells,
    next_tick,
)
from bmoe.serve.monitor import EngineMonitor


def progress(step: int, wall_ms: float = 100.0, stream: StreamCounters | None = None) -> Progress:
    return Progress(step=step, steps=32, wall_ms=wall_ms, delta_text="x", delta_reasoning="", stream=stream)


def counters(**kw: int | float) -> StreamCounters:
    return StreamCounters(**kw)  # type: ignore[arg-type]


# -- LiveTotals ----------------------------------------------------------------------------


def test_the_rate_leaves_out_the_first_token_and_the_hit_rate_counts_expert_requests() -> None:
    t = LiveTotals()
    assert (t.tok_s, t.hit_pct, t.read_mib_per_token, t.stall_ms_per_token) == (None, None, None, None)
    t.add(progress(1, wall_ms=900.0, stream=counters()))  # from the prefill's logits
    assert t.tok_s is None  # no decode token yet
    t.add(progress(2, 50.0, counters(hits=3, misses=1, bytes_read=2 * MIB, stall_s=0.010)))
    t.add(progress(3, 50.0, counters(hits=4, misses=0, bytes_read=0, stall_s=0.0)))
    assert t.tokens == 3 and t.steps == 32
    assert t.tok_s == pytest.approx(2 / 0.1)
    assert t.hit_pct == pytest.approx(100.0 * 7 / 8)
    assert t.read_mib_per_token == pytest.approx(2 / 3)
    assert t.stall_ms_per_token == pytest.approx(10.0 / 3)


def test_a_resident_run_has_a_rate_but_no_streaming_figures() -> None:
    t = LiveTotals()
    for step in (1, 2, 3):
        t.add(progress(step, 20.0))
    assert t.tok_s == pytest.approx(50.0)
    assert (t.hit_pct, t.read_mib_per_token, t.stall_ms_per_token) == (None, None, None)


def test_a_drafted_request_shows_its_drafts_as_they_come() -> None:
    t = LiveTotals()
    t.add(progress(1))
    assert t.drafts is None
    t.add(attrs.evolve(progress(2), drafts=DraftReport(verifies=1, drafted=16, accepted=12)))
    t.add(attrs.evolve(progress(3), drafts=DraftReport(verifies=2, drafted=24, accepted=12, paused=1)))
    view = RequestView(1, "chat", 1.0, t, None, prefill_s=0.1)
    body = MetricsFeed("tiny", streaming=False).event(MonitorView(0, view), None, now=1.0)["request"]
    assert body["drafts"] == {
        "verifies": 2,
        "drafted": 24,
        "accepted": 12,
        "tokens_per_verify": 7.0,  # (12 accepted + 2 own) / 2
        "paused": 1,
    }


# -- heat --------------------------------------------------------------------------------


def test_heat_adds_what_was_routed_since_the_last_update_and_halves_per_half_life() -> None:
    heat = ExpertHeat(half_life_s=1.0)
    assert heat.update([5, 0, 2], now=10.0).tolist() == [0, 0, 0]  # the base: not recent
    assert not heat.warm()
    assert heat.update([7, 0, 2], now=10.0).tolist() == [2, 0, 0]
    assert heat.update([7, 4, 2], now=11.0).tolist() == [1, 4, 0]
    assert heat.update([7, 4, 2], now=13.0).tolist() == pytest.approx([0.25, 1.0, 0.0])
    assert heat.warm()
    # counts that went down (a new session's) restart the base instead of going negative
    assert heat.update([0, 0, 0], now=13.0).tolist() == pytest.approx([0.25, 1.0, 0.0])
    assert heat.update([1, 0, 0], now=13.0).tolist() == pytest.approx([1.25, 1.0, 0.0])
    with pytest.raises(ValueError):
        ExpertHeat(half_life_s=0)


def test_heat_levels_scale_to_the_peak_and_anything_recent_is_at_least_one() -> None:
    assert heat_levels(np.array([0.0, 0.01, 0.5, 10.0, 5.0]), peak=10.0) == [0, 0, 1, 7, 4]
    assert heat_levels(np.array([5.0]), peak=10.0) == [4]
    assert heat_levels(np.array([5.0]), peak=0.0) == [7]  # never above the top
    assert heat_levels(np.zeros(3), peak=0.0) == [0, 0, 0]
    assert heat_levels(np.array([0.2]), peak=1.0) == [0]


def test_an_idle_grid_cools_down_to_nothing() -> None:
    heat = ExpertHeat(half_life_s=1.0)
    heat.update([0, 0], now=0.0)
    heat.update([8, 2], now=0.0)
    assert heat.levels() == [7, 2]
    heat.update([8, 2], now=1.0)  # nothing routed since: the peak falls four times slower
    assert heat.levels() == [5, 2]
    seen = []
    for second in range(2, 12):
        heat.update([8, 2], now=float(second))
        seen.append(heat.levels())
    assert seen[-1] == [0, 0] and not heat.warm()
    assert all(a[0] >= b[0] for a, b in itertools.pairwise(seen))


def test_a_snapshot_must_cover_every_entry() -> None:
    with pytest.raises(ValueError):
        ExpertSnapshot(2, 2, (0, 1), b"\x00" * 3, (0,) * 4, StreamCounters())
    with pytest.raises(ValueError):
        ExpertSnapshot(2, 2, (2,), b"\x00" * 4, (0,) * 4, StreamCounters())


# -- events --------------------------------------------------------------------------------


def snapshot(resident: bytes, routed: tuple[int, ...], **kw: int) -> ExpertSnapshot:
    return ExpertSnapshot(3, 4, (1, 2), resident, routed, counters(**kw))


def test_the_grid_is_a_hex_digit_per_expert_of_each_streamed_layer() -> None:
    snap = snapshot(bytes([0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1]), (0,) * 12)
    levels = [0] * 4 + [7, 7, 0, 1] + [0, 0, 3, 0]
    assert grid_cells(snap, levels) == ["fe12", "0061"]  # layer 0 is not streamed: no row


def test_an_event_of_a_resident_server_has_no_cache() -> None:
    feed = MetricsFeed("tiny", streaming=False)
    event = feed.event(MonitorView(finished=0), None, now=0.0)
    assert event == {
        "model": "tiny",
        "state": "idle",
        "requests": 0,
        "streaming": False,
        "request": None,
        "cache": None,
        "slots": {"total": 1, "busy": 0, "waiting": 0},
        "prompt_cache": None,
    }


def test_an_event_during_a_decode_reports_the_request_and_the_cache() -> None:
    feed = MetricsFeed("tiny", streaming=True, half_life_s=1.0)
    totals = LiveTotals()
    totals.add(progress(1, 500.0, counters()))
    totals.add(progress(2, 100.0, counters(hits=1, misses=3, bytes_read=MIB, stall_s=0.02)))
    request = RequestView(1, "chat", 0.75, totals, None, prefill_done=12, prefill_total=12, prefill_s=0.5)
    view = MonitorView(finished=0, request=request)
    first = snapshot(bytes(12), (0,) * 12, budget_bytes=4 * MIB, resident_bytes=0)
    assert feed.event(view, first, now=1.0)["cache"]["cells"] == ["0000", "0000"]
    routed = (0,) * 4 + (2, 0, 0, 0) + (0, 0, 0, 1)
    resident = bytes([0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1])
    snap = snapshot(resident, routed, budget_bytes=4 * MIB, resident_bytes=2 * MIB, hits=6, misses=2)
    event = feed.event(view, snap, now=1.0)
    assert event["state"] == "decode"
    assert event["requests"] == 0
    assert event["request"] == {
        "number": 1,
        "kind": "chat",
        "outcome": None,
        "elapsed_s": 0.75,
        "tokens": 2,
        "max_tokens": 32,
        "tok_s": 10.0,
        "prefill_done": 12,
        "prefill_total": 12,
        "prefill_s": 0.5,
        "hit_pct": 25.0,
        "read_mib_per_token": 0.5,
        "stall_ms_per_token": 10.0,
        "drafts": None,  # not drafted
    }
    assert event["cache"] == {
        "budget_bytes": 4 * MIB,
        "resident_bytes": 2 * MIB,
        "resident_experts": 2,
        "hit_pct": 75.0,
        "rule": None,  # not reported by this snapshot
        "ghost_hit_pct": None,  # no ghosts (not adaptive)
        "bytes_read": 0,
        "n_layer": 3,
        "n_expert": 4,
        "layers": [1, 2],
        "heat_top": 7,
        "cells": ["f000", "0009"],  # routed twice: hottest (7); once: ceil(7 / 2); bit 0 resident
        "stale": False,
        "governor": None,  # no governor runs
    }
    assert feed.cooling
    # no snapshot this time (the decode held the lock too long): the last one, marked stale
    again = feed.event(view, None, now=1.5)
    assert again["cache"]["cells"] == ["f000", "0009"] and again["cache"]["stale"]


def test_the_cache_carries_the_governors_count_of_changes_and_its_last_one() -> None:
    feed = MetricsFeed("tiny", streaming=True)
    view = MonitorView(0)
    snap = snapshot(b"\x00" * 12, (0,) * 12, budget_bytes=4 * MIB)
    assert feed.event(view, snap, now=1.0, governor=[])["cache"]["governor"] == {"changes": 0, "last": None}
    changes = [
        BudgetChange(4 * MIB, 2 * MIB, "shrink: 100 MiB free"),
        BudgetChange(2 * MIB, 3 * MIB, "grow: x"),
    ]
    assert feed.event(view, snap, now=1.2, governor=changes)["cache"]["governor"] == {
        "changes": 2,
        "last": {"from_bytes": 2 * MIB, "to_bytes": 3 * MIB, "why": "grow: x"},
    }


def test_states_follow_the_request() -> None:
    totals = LiveTotals()
    assert MonitorView(0).state == "idle"
    assert MonitorView(0, RequestView(1, "chat", 0.1, totals)).state == "prefill"
    assert MonitorView(0, RequestView(1, "chat", 0.1, totals, prefill_s=0.1)).state == "decode"
    assert MonitorView(0, RequestView(1, "decide", 0.1, totals)).state == "decide"
    assert MonitorView(1, RequestView(1, "chat", 0.1, totals, "cancelled")).state == "idle"


def test_a_feed_ticks_during_a_prefill_or_a_decision_and_while_the_grid_cools() -> None:
    totals = LiveTotals()
    prefill = MonitorView(0, RequestView(1, "completion", 0.1, totals))
    decode = MonitorView(0, RequestView(1, "chat", 0.1, totals, prefill_s=0.1))
    assert next_tick(prefill, cooling=False) == BUSY_TICK_S
    assert next_tick(MonitorView(0, RequestView(1, "decide", 0.1, totals)), False) == BUSY_TICK_S
    assert next_tick(decode, cooling=True) is None  # each token is news
    assert next_tick(MonitorView(1), cooling=True) == IDLE_TICK_S
    assert next_tick(MonitorView(1), cooling=False) is None


# -- the monitor ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_monitor_follows_a_request_from_its_prefill_to_its_end() -> None:
    clock = Clock()
    feeding = [(1, 1)]  # the call before the request: not its prefill
    monitor = EngineMonitor(lambda: feeding[0], clock)
    news: list[int] = []
    stop = monitor.subscribe(lambda: news.append(1))
    assert monitor.view() == MonitorView(0)
    with monitor.request("chat"):
        view = monitor.view()
        assert view.state == "prefill" and view.request is not None
        assert (view.request.number, view.request.prefill_done, view.request.prefill_total) == (1, 0, 0)
        feeding[0] = (64, 100)
        clock.t += 0.5
        assert monitor.view().request.prefill_done == 64  # type: ignore[union-attr]
        feeding[0] = (100, 100)
        clock.t += 0.25
        monitor.token(progress(1, 10.0))
        feeding[0] = (1, 1)  # the decode's own calls no longer count as the prefill
        monitor.token(progress(2, 10.0))
        view = monitor.view()
        assert view.state == "decode"
        r = view.request
        assert r is not None and (r.prefill_done, r.prefill_total, r.prefill_s) == (100, 100, 0.75)
        assert r.totals.tokens == 2
    view = monitor.view()
    assert view.state == "idle" and view.finished == 1
    assert view.request is not None and view.request.outcome == "done"
    assert len(news) == 4  # began, two tokens, ended
    stop()
    with monitor.request("decide"):
        pass
    assert len(news) == 4


def test_the_monitor_says_how_a_request_ended() -> None:
    monitor = EngineMonitor()
    with pytest.raises(RequestCancelledError), monitor.request("chat"):
        raise RequestCancelledError("gone")
    assert monitor.view().request.outcome == "cancelled"  # type: ignore[union-attr]
    with pytest.raises(KeyError), monitor.request("completion"):
        raise KeyError("boom")
    view = monitor.view()
    assert view.request is not None and (view.request.outcome, view.request.number) == ("error", 2)
    assert view.finished == 2
    monitor.token(progress(1))  # between requests: ignored
    assert view == monitor.view()


def test_the_monitor_can_be_read_while_the_worker_writes() -> None:
    monitor = EngineMonitor()
    done = threading.Event()

    def work() -> None:
        for _ in range(50):
            with monitor.request("chat"):
                for step in range(1, 20):
                    monitor.token(progress(step))
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    while not done.is_set():
        view = monitor.view()
        assert view.request is None or view.request.totals.tokens < 20
    thread.join()
    assert monitor.view().finished == 50


def test_the_event_says_the_slots_busy_and_waiting() -> None:
    feed = MetricsFeed("m", streaming=False)
    view = MonitorView(finished=3)
    assert feed.event(view, None, now=1.0)["slots"] == {"total": 1, "busy": 0, "waiting": 0}
    assert feed.event(view, None, now=1.0, slots=(4, 3, 2))["slots"] == {"total": 4, "busy": 3, "waiting": 2}


def test_the_event_says_what_the_prompt_cache_holds_and_spared() -> None:
    cache = PromptCache(4 << 20)
    cache.store([1, 2, 3], np.zeros(1 << 20, dtype=np.uint8))
    found = cache.lookup([1, 2, 3, 4])
    assert found is not None
    cache.restored(found)
    feed = MetricsFeed("tiny", streaming=False)
    body = feed.event(MonitorView(finished=0), None, now=1.0, prompt_cache=cache)
    assert body["prompt_cache"] == {
        "entries": 1,
        "mib": 1.0,
        "limit_mib": 4.0,
        "restored": 1,
        "tokens_restored": 3,
    }


def test_with_a_disk_tier_the_event_says_what_went_there_and_came_back(tmp_path: Path) -> None:
    from bmoe.adapters.state_files import StateFiles

    cache = PromptCache(0, StateFiles(tmp_path, "ab" * 16, 8 << 20))
    cache.store([1, 2, 3], np.zeros(1 << 10, dtype=np.uint8))  # no room in memory: to the disk
    assert cache.lookup([1, 2, 3, 4]) is not None
    body = MetricsFeed("tiny", streaming=False).event(
        MonitorView(finished=0), None, now=1.0, prompt_cache=cache
    )
    assert body["prompt_cache"]["entries"] == 0
    assert body["prompt_cache"]["disk"] == {"entries": 1, "written": 1, "read_back": 1, "refused": 0}


def test_the_cache_names_the_rule_in_charge_and_the_ghosts_hit_rates() -> None:
    """--cache-policy adaptive: which rule evicts now, and what each ghost cache hit."""
    feed = MetricsFeed("tiny", streaming=True)
    snap = ExpertSnapshot(
        3,
        4,
        (1, 2),
        b"\x00" * 12,
        (0,) * 12,
        StreamCounters(
            cache_rule="lru", ghost_wanted=8, ghost_lru_hits=6, ghost_slru_hits=4, ghost_lfu_hits=2
        ),
    )
    cache = feed.event(MonitorView(0), snap, now=1.0)["cache"]
    assert (cache["rule"], cache["ghost_hit_pct"]) == ("lru", {"lru": 75.0, "slru": 50.0, "lfu": 25.0})
