"""Loading shows progress on stderr only when it takes more than a second."""

from __future__ import annotations

import io

from bmoe.cli.live import LoadProgress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_quick_load_says_nothing_and_a_slow_one_says_each_phase() -> None:
    out, clock = io.StringIO(), Clock()
    shown = LoadProgress(out, clock=clock)
    shown("loading the model", 0.5)
    clock.t = 0.9
    shown("loading the model", 1.0)
    assert out.getvalue() == ""  # under a second: nothing
    shown = LoadProgress(out, clock=clock)
    clock.t = 2.5
    shown("loading the model", 0.25)
    clock.t = 2.6
    shown("loading the model", 0.5)  # within half a second of the last line: not shown
    shown("loading the model", 1.0)  # a phase's end always is
    shown("setting up expert streaming", 0.0)
    shown.close()
    assert out.getvalue().splitlines() == [
        "loading: loading the model 25%",
        "loading: loading the model 100%",
        "loading: setting up expert streaming 0%",
    ]
