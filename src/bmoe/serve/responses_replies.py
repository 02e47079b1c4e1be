"""OpenAI's Responses API answers: the response object and its stream of events, from the
neutral ``Delta`` pieces and ``Outcome``.

``ResponsesWriter`` follows one reply: ``start()`` gives ``response.created`` and
``response.in_progress``; each ``delta()`` the events its piece adds (an output item opened
with ``response.output_item.added`` and, for text, ``response.content_part.added``; then
``response.reasoning_text.delta``, ``response.output_text.delta`` or
``response.function_call_arguments.delta``; the item before it closed with its ``.done``
events); ``finish()`` closes what is open and ends with ``response.completed`` (or
``response.incomplete``, ``incomplete_details.reason`` ``max_output_tokens``); ``fail()``
with ``error`` and ``response.failed``. Every event has its ``sequence_number``. A whole
(not streamed) answer is the same writer fed the outcome as one piece: its ``response`` is
the object a stream's last event carries.

Output items: ``reasoning`` (the thinking span, as ``reasoning_text`` content; no summary),
``message`` (one ``output_text`` part) and ``function_call`` (``call_id`` the call's id).
"""

from __future__ import annotations

import uuid
from typing import Any

from bmoe.domain.tools import ToolCall
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.api_responses import Envelope
from bmoe.serve.errors import ApiError
from bmoe.serve.responses_requests import ResponsesRequest

Json = dict[str, Any]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(o: Outcome) -> Json:
    return {
        "input_tokens": o.prompt_tokens,
        "input_tokens_details": {"cached_tokens": o.cached_tokens},
        "output_tokens": o.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},  # not counted apart
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


class ResponsesWriter:
    """The events and the response object of one reply (see the module's docstring)."""

    def __init__(self, env: Envelope, asked: ResponsesRequest) -> None:
        self.env = env
        self.asked = asked
        self.sequence = 0
        self.items: list[Json] = []
        self._open: Json | None = None  # the reasoning or message item text goes to now
        self._calls: dict[int, Json] = {}  # a streamed call's index -> its item
        self.response: Json = self._object("in_progress")

    def _object(self, status: str, o: Outcome | None = None, error: Json | None = None) -> Json:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.env.id,
            "object": "response",
            "created_at": self.env.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.env.model,
            "output": [dict(item) for item in self.items],
            "previous_response_id": self.asked.previous_response_id,
            "store": self.asked.store,
            "truncation": "disabled",
            "usage": usage(o) if o is not None else None,
            "user": None,
            **self.asked.echo,
        }

    def _event(self, kind: str, **fields: Any) -> Json:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[Json]:
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    # -- items -----------------------------------------------------------------------------

    def _add(self, item: Json) -> list[Json]:
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))]

    def _where(self, item: Json) -> Json:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def _open_text(self, kind: str) -> list[Json]:
        """Open a ``reasoning`` or ``message`` item (closing the one open)."""
        events = self._close_open()
        if kind == "reasoning":
            item: Json = {
                "id": new_item_id("rs"),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
            }
            part: Json = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress"}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events += self._add({**item, "content": []})
        item = self.items[-1]
        item["content"] = [part]
        events.append(
            self._event("response.content_part.added", **self._where(item), content_index=0, part=dict(part))
        )
        self._open = item
        return events

    def _close_open(self, status: str = "completed") -> list[Json]:
        item, self._open = self._open, None
        if item is None:
            return []
        part = item["content"][0]
        kind = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
        extra: Json = {} if item["type"] == "reasoning" else {"logprobs": []}
        item["status"] = status
        return [
            self._event(kind, **self._where(item), content_index=0, text=part["text"], **extra),
            self._event("response.content_part.done", **self._where(item), content_index=0, part=dict(part)),
            self._event("response.output_item.done", output_index=self.items.index(item), item=dict(item)),
        ]

    def _text(self, kind: str, text: str) -> list[Json]:
        events = [] if self._open is not None and self._open["type"] == kind else self._open_text(kind)
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: Json = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self._event(name, **self._where(item), content_index=0, delta=text, **extra))
        return events

    def _open_call(self, call_id: str, name: str) -> tuple[Json, list[Json]]:
        events = self._close_open()
        item = {
            "id": new_item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        events += self._add(item)
        return self.items[-1], events

    def _arguments(self, item: Json, piece: str) -> list[Json]:
        if not piece:
            return []
        item["arguments"] += piece
        return [self._event("response.function_call_arguments.delta", **self._where(item), delta=piece)]

    def _close_call(self, item: Json, final: ToolCall | None, status: str = "completed") -> list[Json]:
        if final is not None:
            item["arguments"] = final.arguments
        item["status"] = status
        return [
            self._event(
                "response.function_call_arguments.done",
                **self._where(item),
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=self.items.index(item), item=dict(item)),
        ]

    # -- the reply -------------------------------------------------------------------------

    def delta(self, d: Delta) -> list[Json]:
        events: list[Json] = []
        if d.reasoning:
            events += self._text("reasoning", d.reasoning)
        if d.text:
            events += self._text("message", d.text)
        for call in d.tool_calls:
            item, opened = self._open_call(call.id, call.name)
            events += opened + self._arguments(item, call.arguments) + self._close_call(item, call)
        for piece in d.call_deltas:
            if piece.index not in self._calls:
                self._calls[piece.index], opened = self._open_call(piece.id, piece.name)
                events += opened
            events += self._arguments(self._calls[piece.index], piece.arguments)
        return events

    def finish(self, o: Outcome) -> list[Json]:
        """Close what is open and end the response (the object is ``response`` then)."""
        status = "incomplete" if o.finish_reason == "length" else "completed"
        if not o.tool_calls and not any(item["type"] == "message" for item in self.items):
            events = self._open_text("message")  # an empty answer is still a message
        else:
            events = []
        events += self._close_open(status)
        finals = {call.id: call for call in o.tool_calls}
        for item in self._calls.values():
            events += self._close_call(item, finals.get(item["call_id"]), status)
        self._calls.clear()
        self.response = self._object(status, o)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self.response)]

    def fail(self, err: ApiError) -> list[Json]:
        """End the stream after an error: ``error``, then ``response.failed``."""
        error = {"code": err.code or err.type, "message": err.message}
        self.response = self._object("failed", error=error)
        return [
            self._event("error", code=err.code or err.type, message=err.message, param=err.param),
            self._event("response.failed", response=self.response),
        ]

    def whole(self, o: Outcome) -> Json:
        """The response object of a reply not streamed."""
        text = o.text if o.text.strip() or not o.tool_calls else ""
        self.delta(Delta(text=text, reasoning=o.reasoning, tool_calls=o.tool_calls))
        self.finish(o)
        return self.response


def deleted(response_id: str) -> Json:
    """The answer to ``DELETE /v1/responses/{id}``."""
    return {"id": response_id, "object": "response", "deleted": True}


def input_tokens(n: int) -> Json:
    """The answer to ``POST /v1/responses/input_tokens``."""
    return {"object": "response.input_tokens", "input_tokens": n}
