"""``IRouterView``: the router of the decode layer call being served, for the decode routing
policies of the reference mode.

Policy (what to commit, substitute, drop, rank and read ahead) lives in
``bmoe.domain.streaming.decode_routing``. A view only reads and writes what the graph holds
for one decode token's MoE layer call, and evaluates routers with the engine's own kernel; it
is valid only while that call is served.

Implemented by ``bmoe.adapters.router_view.StreamerRouterView`` (the C streamer's node) and
``bmoe.testing.fake_router_view.FakeRouterView`` (scripted values, recorded writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bmoe.domain.streaming.decode_routing import RouterScores


class IRouterView(Protocol):
    def probs(self) -> Sequence[float] | None:
        """The router's probabilities of every expert, or None when they cannot be read."""
        ...

    def has_input(self) -> bool:
        """Whether the router's input can be read (``scores`` needs it)."""
        ...

    def scores(self, layer: int) -> RouterScores:
        """``layer``'s router evaluated on this call's router input. Raises ``ValueError``
        without an input or a router of that layer."""
        ...

    def write_ids(self, ids: Sequence[int]) -> None:
        """Replace the call's selection (before anything uses it). Raises ``ValueError`` for
        a selection of another size or an id out of range (nothing written)."""
        ...

    def drop(self, dropped: Sequence[bool]) -> None:
        """Zero the dropped slots' weights (the survivors renormalised to the selection's
        total) and leave their experts unread. Raises ``ValueError`` without probabilities."""
        ...
