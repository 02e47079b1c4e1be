"""``FakeRouterView``: an ``IRouterView`` with scripted routers, for the routing policies'
tests on the fake expert source.

Each layer's router is a row of selection scores (its ``values`` are the same numbers):
``scores(layer)`` returns it, whatever the input. ``probs`` is the current call's row (None:
unreadable); ``input`` False makes the input unreadable. Writes are recorded:
``written`` (each ``write_ids``) and ``dropped`` (each ``drop``).
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.domain.streaming.decode_routing import RouterScores
from bmoe.ports.router_view import IRouterView


class FakeRouterView(IRouterView):
    def __init__(self, routers: dict[int, Sequence[float]], *, input: bool = True) -> None:
        self.routers = {layer: tuple(row) for layer, row in routers.items()}
        self.input = input
        self.row: Sequence[float] | None = None
        self.written: list[list[int]] = []
        self.dropped: list[list[bool]] = []
        self.evaluated: list[int] = []  # layers whose router was evaluated, in order

    def probs(self) -> Sequence[float] | None:
        return self.row

    def has_input(self) -> bool:
        return self.input

    def scores(self, layer: int) -> RouterScores:
        if not self.input or layer not in self.routers:
            raise ValueError(f"no router input or no router of layer {layer}")
        self.evaluated.append(layer)
        return RouterScores(self.routers[layer], self.routers[layer])

    def write_ids(self, ids: Sequence[int]) -> None:
        self.written.append(list(ids))

    def drop(self, dropped: Sequence[bool]) -> None:
        if self.row is None:
            raise ValueError("no probabilities")
        self.dropped.append(list(dropped))
