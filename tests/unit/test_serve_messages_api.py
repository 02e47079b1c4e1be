"""Anthropic's Messages API bodies read into the neutral request, and its answers and events
written from the neutral result (no model, no HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.tools import ToolCall, ToolChoice
from bmoe.domain.tools.call_stream import CallDelta
from bmoe.errors import RequestError
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import ApiError
from bmoe.serve.messages_replies import MessagesWriter, stop_reason
from bmoe.serve.messages_requests import parse_messages

TOOL = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


def test_blocks_become_one_conversation_results_before_text_thinking_kept_out() -> None:
    asked = parse_messages(
        {
            "model": "claude-x",
            "max_tokens": 50,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Time?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "x"},
                        {"type": "text", "text": "Let me see."},
                        {"type": "tool_use", "id": "t1", "name": "get_time", "input": {"tz": "UTC"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "noon", "is_error": False},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
            "tools": [TOOL, {"type": "bash_20250124", "name": "bash"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "thinking": {"type": "disabled"},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_k": 5,
            "metadata": {"user_id": "u"},
        }
    )
    chat = asked.chat
    assert asked.model == "claude-x"
    assert chat.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Time?"),
        ChatMessage("assistant", "Let me see.", tool_calls=(ToolCall("t1", "get_time", '{"tz": "UTC"}'),)),
        ChatMessage("tool", "noon", tool_call_id="t1"),
        ChatMessage("user", "Thanks"),
    )
    assert chat.tools is not None and [t.name for t in chat.tools.tools] == ["get_time"]
    assert (chat.tools.choice, chat.tools.parallel) == (ToolChoice("required"), False)
    gen = chat.generation
    assert (chat.think, gen.stop, gen.max_tokens, gen.sampling.temperature, gen.sampling.top_k) == (
        False,
        ("END",),
        50,
        0.5,
        5,
    )


def test_a_structured_output_goes_through_the_constraint_engine() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}}
    asked = parse_messages(
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
        }
    )
    assert asked.chat.generation.constraint == OutputConstraint.json_schema(schema)
    assert asked.chat.think is True
    counted = parse_messages({"messages": [{"role": "user", "content": "Hi"}]}, counting=True)
    assert counted.chat.generation.max_tokens is None


USER: Any = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER}, "max_tokens"),
        ({"max_tokens": 0, "messages": USER}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 5, "messages": [*USER, {"role": "assistant", "content": "Sure"}]}, "messages"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "id": 1}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 5, "messages": USER, "tool_choice": {"type": "any"}}, "tool_choice"),
        ({"max_tokens": 5, "messages": USER, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"max_tokens": 5, "messages": USER, "thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"max_tokens": 5, "messages": USER, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_messages(body)
    assert info.value.param == param


def outcome(text: str = "", reasoning: str = "", finish: Any = "stop", **kw: Any) -> Outcome:
    return Outcome(text, reasoning, finish, 10, 4, 3, **kw)


def test_stop_reasons_and_usage_as_anthropic_counts_them() -> None:
    assert stop_reason(outcome()) == "end_turn"
    assert stop_reason(outcome(finish="length")) == "max_tokens"
    assert stop_reason(outcome(stop_string="END")) == "stop_sequence"
    assert stop_reason(outcome(finish="tool_calls", tool_calls=(ToolCall("c", "f"),))) == "tool_use"
    message = MessagesWriter("msg_1", "m").whole(outcome("OK", "hm"))
    assert message["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "OK"},
    ]
    assert message["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 0,
    }


def test_a_streamed_reply_opens_a_block_per_kind_and_ends_with_the_reason() -> None:
    writer = MessagesWriter("msg_1", "m")
    events = writer.start()
    events += writer.delta(Delta(reasoning="hm"))
    events += writer.delta(Delta(text="OK"))
    events += writer.delta(Delta(call_deltas=(CallDelta(0, "c1", "get_time", '{"a"'),)))
    events += writer.delta(Delta(call_deltas=(CallDelta(0, arguments=": 1}"),)))
    events += writer.finish(
        outcome("OK", "hm", "tool_calls", tool_calls=(ToolCall("c1", "get_time", '{"a": 1}'),))
    )
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[8]["content_block"] == {"type": "tool_use", "id": "c1", "name": "get_time", "input": {}}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert writer.message["content"][2]["input"] == {"a": 1}


def test_anthropic_error_types_follow_the_status() -> None:
    assert ApiError(401, "no", "invalid_request_error").anthropic_body() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "no"},
    }
    assert ApiError(404, "x", "invalid_request_error").anthropic_body()["error"]["type"] == "not_found_error"
    assert ApiError(503, "x", "server_error").anthropic_body()["error"]["type"] == "overloaded_error"
