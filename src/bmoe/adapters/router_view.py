"""``StreamerRouterView``: ``IRouterView`` over the C streamer's reference hook.

The streamer exposes the decode layer call it is serving (``ExpertStreamer.reference_call``, a
``ReferenceCall``): the
router's probabilities and input found from the topk node, the fast path's router kernel
(``router_scores``, so that scores are summed in the same order), and the writes the fast
path makes (the ids; ``drop_weights`` and the zero pages for dropped slots).
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.cext.expert_stream import ExpertStreamer
from bmoe.domain.streaming.decode_routing import RouterScores
from bmoe.ports.router_view import IRouterView


class StreamerRouterView(IRouterView):
    """Borrows the streamer; valid inside its reference hook only."""

    def __init__(self, streamer: ExpertStreamer) -> None:
        self._call = streamer.reference_call

    def probs(self) -> Sequence[float] | None:
        return self._call.probs()

    def has_input(self) -> bool:
        return self._call.has_input()

    def scores(self, layer: int) -> RouterScores:
        selection, values = self._call.router(layer)
        return RouterScores(tuple(selection), tuple(values))

    def write_ids(self, ids: Sequence[int]) -> None:
        self._call.write_ids(list(ids))

    def drop(self, dropped: Sequence[bool]) -> None:
        self._call.drop(list(dropped))
