"""``--cache-victims auto``: the chooser weighs misses and page moves at the costs measured
(``victims_chooser``), and the control feeds it windows of decode steps only
(``victims_control``)."""

from __future__ import annotations

import attrs
import pytest

from bmoe.domain.streaming import StreamCounters
from bmoe.domain.streaming.victims import Victims
from bmoe.domain.streaming.victims_chooser import MARGIN, MOVE_SHARE, ScopeWindow, VictimsChooser
from bmoe.runtime.victims_control import VictimsControl, window_between


def window(
    *,
    misses: int = 1000,
    moves: int = 1000,
    twin_misses: int = 1050,
    twin_moves: int = 0,
    read_s: float,
    move_s: float,
) -> ScopeWindow:
    """16 tokens under global: ``misses`` cost ``read_s`` in all, ``moves`` ``move_s`` on the
    eval thread; the twin (layer victims) misses more and moves nothing."""
    return ScopeWindow(16, misses, moves, twin_misses, twin_moves, read_s, move_s, moves)


def test_the_scope_that_moves_pages_gives_way_where_a_move_costs_more_than_the_misses_it_saves() -> None:
    """A VM: a move 40 us on the eval thread (80 with the compute's), a miss 1 ms; layer victims
    miss 50 more and move 1,000 fewer: 50 ms against 80 ms."""
    chooser = VictimsChooser()
    verdict = chooser.observe(window(read_s=1.0, move_s=0.040))
    assert verdict.switched and chooser.scope == "layer" and chooser.switches == 1
    assert verdict.live == "global" and verdict.twin_s is not None and verdict.live_s is not None
    assert verdict.twin_s < verdict.live_s
    assert chooser.move_s == pytest.approx(MOVE_SHARE * 0.040 / 1000)


def test_where_reads_are_dear_the_global_choice_stays() -> None:
    """A slow disk: a miss 6 ms; 50 more misses cost 300 ms, the moves 80 ms."""
    chooser = VictimsChooser()
    assert not chooser.observe(window(read_s=6.0, move_s=0.040)).switched
    assert chooser.scope == "global"


def test_nothing_is_decided_before_both_costs_are_measured() -> None:
    chooser = VictimsChooser()
    verdict = chooser.observe(window(read_s=1.0, move_s=0.0, moves=0, twin_moves=0))  # no move yet
    assert not verdict.switched and verdict.live_s is None and chooser.move_s is None
    assert chooser.miss_s == pytest.approx(1.0 / 1000)


def test_a_lead_within_the_margin_changes_nothing_and_the_last_move_cost_is_kept() -> None:
    chooser = VictimsChooser()
    # the twin's 1,050 ms against 1,000 + 1,000 moves of 2 x 25 us: equal, no switch
    assert not chooser.observe(window(read_s=1.0, move_s=0.025)).switched
    assert chooser.observe(window(read_s=1.0, move_s=0.040)).switched
    kept = chooser.move_s
    # under layer victims no page moves: the move's cost is the last measured; the twin (now
    # global) would move 1,000 and miss 50 fewer: still dearer, no switch back
    layer_window = ScopeWindow(16, 1050, 0, 1000, 1000, 1.05, 0.0, 0)
    assert not chooser.observe(layer_window).switched and chooser.move_s == kept
    # the disk slows down 10x: the misses the twin saves are worth its moves again
    slow = ScopeWindow(16, 1050, 0, 1000, 1000, 10.5, 0.0, 0)
    assert chooser.observe(slow).switched and chooser.scope == "global" and chooser.switches == 2
    assert MARGIN > 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        VictimsChooser(margin=-0.1)
    with pytest.raises(ValueError):
        VictimsChooser(move_share=0)


class Target:
    def __init__(self) -> None:
        self.scopes: list[Victims] = []

    def set_victims(self, victims: Victims) -> None:
        self.scopes.append(victims)


def test_the_control_weighs_windows_of_decode_steps_and_restarts_after_a_prompt() -> None:
    """Each decode step adds 100 misses, 100 moves at 40 us, 1 s of reads (the twin: 105
    misses, no move): every window of 2 decode steps says layer; a prompt's counters never
    enter a window."""
    state = {"n": 0, "prompt": 0, "layer_n": 0}
    target = Target()

    def counters() -> StreamCounters:
        n, p, ln = state["n"], state["prompt"], state["layer_n"]  # steps under global, prompts, under layer
        return StreamCounters(
            misses=100 * n + 105 * ln + 10_000 * p,
            cross_evictions=100 * n,
            twin_misses=105 * n + 100 * ln + 10_000 * p,
            twin_cross_evictions=100 * ln,
            stall_s=0.1 * n + 0.105 * ln + 50.0 * p,
            release_s=0.004 * n,
            pages_recycled=100 * n,
        )

    control = VictimsControl(counters, target, window_tokens=2)
    control.before_decode(False)  # a prompt comes
    state["prompt"] += 1
    control.before_decode(True)  # the window opens after it
    state["n"] += 1
    control.before_decode(True)
    assert target.scopes == []  # one step: the window is not full
    state["n"] += 1
    control.before_decode(True)
    assert target.scopes == ["layer"]
    control.before_decode(False)  # the open window (one step) is dropped
    state["prompt"] += 1
    control.before_decode(True)
    state["layer_n"] += 1
    control.before_decode(True)
    state["layer_n"] += 1
    control.before_decode(True)
    assert control.chooser.switches == 1  # layer weighed against the global twin: it stays
    with pytest.raises(ValueError):
        VictimsControl(counters, target, window_tokens=0)


def test_a_window_is_the_difference_of_the_counters() -> None:
    before = StreamCounters(
        misses=5, cross_evictions=3, twin_misses=6, stall_s=1.0, release_s=0.5, pages_recycled=2
    )
    after = attrs.evolve(
        before, misses=15, cross_evictions=7, twin_misses=20, stall_s=3.0, release_s=0.7, pages_recycled=6
    )
    w = window_between(before, after, 4)
    assert (w.tokens, w.misses, w.cross_evictions, w.twin_misses, w.pages_moved) == (4, 10, 4, 14, 4)
    assert w.stall_s == pytest.approx(2.0) and w.move_s == pytest.approx(0.2)
