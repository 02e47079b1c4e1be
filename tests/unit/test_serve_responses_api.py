"""The Responses API's bodies read into the neutral request, and its answers and events
written from the neutral result (no model, no HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.tools import ToolCall
from bmoe.domain.tools.call_stream import CallDelta
from bmoe.errors import RequestError
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.api_responses import Envelope
from bmoe.serve.errors import ApiError
from bmoe.serve.response_store import ResponseStore, StoredResponse
from bmoe.serve.responses_replies import ResponsesWriter
from bmoe.serve.responses_requests import parse_responses

ENV = Envelope(id="resp_1", created=100, model="tiny")
FUNCTION = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def refused(body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_responses(body)
    return info.value


def test_input_items_become_one_conversation_with_calls_joined_to_their_turn() -> None:
    asked = parse_responses(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Time?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": ""},
                {"type": "function_call_output", "call_id": "c1", "output": "noon"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "1"}],
                },
            ],
            "tools": [FUNCTION, {"type": "web_search"}, {"type": "local_shell"}],
            "reasoning": {"effort": "minimal"},
        }
    )
    calls = (ToolCall("c1", "get_time", "{}"), ToolCall("c2", "get_time", "{}"))
    assert asked.input == (
        ChatMessage("system", "Use tools."),
        ChatMessage("user", "Time?"),
        ChatMessage("assistant", "Let me see.", tool_calls=calls),
        ChatMessage("tool", "noon", tool_call_id="c1"),
        ChatMessage("tool", "1", tool_call_id="c2"),
    )
    assert asked.tools is not None and [t.name for t in asked.tools.tools] == ["get_time"]
    assert asked.think is False
    earlier = (ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello"))
    chat = asked.chat(earlier)
    assert chat.messages[:3] == (ChatMessage("system", "Be brief."), *earlier)
    assert chat.tools == asked.tools and chat.think is False


def test_text_format_goes_through_the_constraint_engine_and_sampling_is_read() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    asked = parse_responses(
        {
            "input": "Hi",
            "text": {"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": True}},
            "max_output_tokens": 30,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["\n\n"],
            "store": False,
            "metadata": {"k": "v"},
            "include": ["reasoning.encrypted_content"],
        }
    )
    gen = asked.generation
    assert gen.constraint == OutputConstraint.json_schema(schema)
    assert (gen.max_tokens, gen.sampling.temperature, gen.sampling.top_p, gen.stop) == (
        30,
        0.5,
        0.9,
        ("\n\n",),
    )
    assert asked.store is False and asked.echo["metadata"] == {"k": "v"}
    assert parse_responses(
        {"input": "Hi", "text": {"format": {"type": "json_object"}}}
    ).generation.constraint == (OutputConstraint("json_object"))
    assert (
        parse_responses({"input": "Hi", "text": {"format": {"type": "text"}}}).generation.constraint is None
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": ""}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "truncation": "auto"}, "truncation"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        (
            {"input": "Hi", "tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice",
        ),
        ({"input": "Hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": "Hi", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"input": "Hi", "temperature": 3}, "temperature"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_a_conversation_must_end_with_a_user_message_or_a_result() -> None:
    asked = parse_responses({"input": [{"role": "assistant", "content": "x"}]})
    with pytest.raises(RequestError) as info:
        asked.chat()
    assert info.value.param == "messages"


def outcome(
    text: str = "", reasoning: str = "", finish: Any = "stop", calls: tuple[ToolCall, ...] = ()
) -> Outcome:
    return Outcome(text, reasoning, finish, 10, 4, 3, calls)


def test_a_streamed_reply_opens_and_closes_each_item_in_order_numbering_every_event() -> None:
    writer = ResponsesWriter(ENV, parse_responses({"input": "Hi", "tools": [FUNCTION]}))
    events = writer.start()
    events += writer.delta(Delta(reasoning="hm"))
    events += writer.delta(Delta(text="O", reasoning=""))
    events += writer.delta(Delta(text="K"))
    events += writer.delta(Delta(call_deltas=(CallDelta(0, "call_1", "get_time", '{"'),)))
    events += writer.delta(Delta(call_deltas=(CallDelta(0, arguments='a": 1}'),)))
    final = ToolCall("call_1", "get_time", '{"a": 1}')
    events += writer.finish(outcome("OK", "hm", "tool_calls", (final,)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    response = events[-1]["response"]
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][1]["content"][0]["text"] == "OK"
    assert response["output"][2]["arguments"] == '{"a": 1}' and response["output"][2]["call_id"] == "call_1"
    assert response["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14,
    }


def test_a_whole_reply_cut_by_max_tokens_is_incomplete_and_an_empty_one_is_still_a_message() -> None:
    cut = ResponsesWriter(ENV, parse_responses({"input": "Hi"})).whole(outcome("abc", finish="length"))
    assert (cut["status"], cut["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert cut["output"][0]["status"] == "incomplete"
    empty = ResponsesWriter(ENV, parse_responses({"input": "Hi"})).whole(outcome())
    assert [item["type"] for item in empty["output"]] == ["message"]
    calls_only = ResponsesWriter(ENV, parse_responses({"input": "Hi"})).whole(
        outcome("\n", finish="tool_calls", calls=(ToolCall("c", "f"),))
    )
    assert [item["type"] for item in calls_only["output"]] == ["function_call"]


def test_an_error_mid_stream_ends_with_error_then_response_failed() -> None:
    writer = ResponsesWriter(ENV, parse_responses({"input": "Hi"}))
    writer.start()
    events = writer.fail(ApiError(503, "gone", "server_error", None, "session_unavailable"))
    assert [e["type"] for e in events] == ["error", "response.failed"]
    assert events[1]["response"]["error"] == {"code": "session_unavailable", "message": "gone"}


def test_the_store_keeps_the_newest_responses() -> None:
    store = ResponseStore(capacity=2)
    for n in range(3):
        store.put(f"r{n}", StoredResponse({"id": f"r{n}"}, ()))
    assert store.get("r0") is None and store.get("r2") is not None and len(store) == 2
    assert store.delete("r1") and not store.delete("r1")
