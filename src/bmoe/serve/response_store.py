"""The responses the server keeps (``store``), for ``previous_response_id`` and
``GET``/``DELETE /v1/responses/{id}``: in memory, bounded, the oldest dropped first.

Each stored response holds its body (what ``GET`` answers) and its conversation: the
messages it was answered from (its ``instructions`` left out, as OpenAI does not carry
them to the next response) and its answer, which a request naming it continues.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import attrs

from bmoe.domain.chat import ChatMessage

RESPONSES_KEPT = 256
"""How many responses the server keeps by default (the oldest are dropped first)."""


@attrs.frozen
class StoredResponse:
    body: dict[str, Any]
    conversation: tuple[ChatMessage, ...]


class ResponseStore:
    """At most ``capacity`` responses by id; any thread."""

    def __init__(self, capacity: int = RESPONSES_KEPT) -> None:
        if capacity < 0:
            raise ValueError("a store holds at least 0 responses")
        self.capacity = capacity
        self._kept: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            self._kept[response_id] = stored
            self._kept.move_to_end(response_id)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Drop a response; whether it was there."""
        with self._lock:
            return self._kept.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)
