"""Anthropic's Messages API answers: the message and its stream of events, from the
neutral ``Delta`` pieces and ``Outcome``.

``MessagesWriter`` follows one reply: ``start()`` gives ``message_start`` and a ``ping``;
each ``delta()`` the events its piece adds (a content block opened with
``content_block_start``, its ``content_block_delta`` pieces, ``thinking_delta``,
``text_delta`` or ``input_json_delta``, the block before it closed with
``content_block_stop``); ``finish()`` closes what is open and ends with ``message_delta``
(``stop_reason``, ``stop_sequence``, the usage) and ``message_stop``. A whole answer is the
same writer fed the outcome as one piece.

Blocks: ``thinking`` (the thinking span; no signature, so it cannot be verified), ``text``
and ``tool_use`` (``input`` the call's arguments). ``stop_reason``: ``end_turn``,
``max_tokens``, ``stop_sequence`` (with ``stop_sequence``) or ``tool_use``. Usage as
Anthropic counts it: ``input_tokens`` the prompt tokens computed, ``cache_read_input_tokens``
those whose KV was kept from the previous request.
"""

from __future__ import annotations

import uuid
from typing import Any

from bmoe.domain.tools import ToolCall
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import ApiError

Json = dict[str, Any]


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(o: Outcome) -> str:
    if o.finish_reason == "tool_calls":
        return "tool_use"
    if o.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if o.stop_string is not None else "end_turn"


def usage(o: Outcome | None) -> Json:
    if o is None:
        return {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
    return {
        "input_tokens": o.prompt_tokens - o.cached_tokens,
        "output_tokens": o.completion_tokens,
        "cache_read_input_tokens": o.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _input(call: ToolCall) -> Any:
    """A call's arguments as an object (``{}`` when they are not one: a call cut short)."""
    arguments = call.arguments_object()
    return arguments if isinstance(arguments, dict) else {}


class MessagesWriter:
    """The events and the message of one reply (see the module's docstring)."""

    def __init__(self, message_id: str, model: str) -> None:
        self.message: Json = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(None),
        }
        self.blocks: list[Json] = self.message["content"]
        self._open: Json | None = None
        self._partial: dict[int, str] = {}  # an open tool_use block's arguments so far, by block index
        self._calls: dict[int, int] = {}  # a streamed call's index -> its block's index

    def start(self) -> list[Json]:
        return [{"type": "message_start", "message": {**self.message, "content": []}}, {"type": "ping"}]

    def _close(self) -> list[Json]:
        block, self._open = self._open, None
        if block is None:
            return []
        index = self.blocks.index(block)
        if index in self._partial:
            block["input"] = _parsed(self._partial.pop(index))
        return [{"type": "content_block_stop", "index": index}]

    def _start(self, block: Json) -> list[Json]:
        events = self._close()
        empty = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        self.blocks.append(block)
        self._open = block
        return [
            *events,
            {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": empty},
        ]

    def _text(self, kind: str, text: str) -> list[Json]:
        events = [] if self._open is not None and self._open["type"] == kind else self._start(_empty(kind))
        assert self._open is not None
        self._open[kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return [*events, {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}]

    def _arguments(self, piece: str) -> list[Json]:
        index = len(self.blocks) - 1
        self._partial[index] = self._partial.get(index, "") + piece
        if not piece:
            return []
        delta = {"type": "input_json_delta", "partial_json": piece}
        return [{"type": "content_block_delta", "index": index, "delta": delta}]

    def delta(self, d: Delta) -> list[Json]:
        events: list[Json] = []
        if d.reasoning:
            events += self._text("thinking", d.reasoning)
        if d.text:
            events += self._text("text", d.text)
        for call in d.tool_calls:
            events += self._start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            events += self._arguments(call.arguments)
        for piece in d.call_deltas:
            if piece.index not in self._calls:
                events += self._start({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
                self._calls[piece.index] = len(self.blocks) - 1
            events += self._arguments(piece.arguments)
        return events

    def finish(self, o: Outcome) -> list[Json]:
        """Close what is open and end the message (``message`` is whole then)."""
        events = self._close()
        finals = {call.id: call for call in o.tool_calls}
        for block in self.blocks:
            if block["type"] == "tool_use" and block["id"] in finals:
                block["input"] = _input(finals[block["id"]])
        self.message.update(stop_reason=stop_reason(o), stop_sequence=o.stop_string, usage=usage(o))
        delta = {"stop_reason": self.message["stop_reason"], "stop_sequence": o.stop_string}
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": usage(o)},
            {"type": "message_stop"},
        ]

    def whole(self, o: Outcome) -> Json:
        """The message of a reply not streamed."""
        text = o.text if o.text.strip() or not o.tool_calls else ""
        self.delta(Delta(text=text, reasoning=o.reasoning, tool_calls=o.tool_calls))
        self.finish(o)
        return self.message


def _empty(kind: str) -> Json:
    return (
        {"type": "thinking", "thinking": "", "signature": ""}
        if kind == "thinking"
        else {"type": "text", "text": ""}
    )


def _parsed(arguments: str) -> Any:
    return _input(ToolCall("", "_", arguments or "{}"))


def error_event(err: ApiError) -> Json:
    """An error after the stream began: the ``error`` event."""
    return err.anthropic_body()
