"""What agent frameworks send, through the official ``openai`` client, on the tiny fixture:
tool calls (forced, streamed or not, then a tool's result), JSON-schema replies,
log-probabilities, penalties and ``logit_bias``, and the errors for what cannot be honoured.

The fixture's weights are random, so it never chooses a tool by itself: ``auto`` is tested
on scripted replies (``tests/unit/test_tool_replies.py``); here ``required`` and a named
function, which a grammar enforces, return valid calls whatever the weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from test_server import Running, serving  # the in-process server of test_server.py

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "1024", "--chat-template-file", str(QWEN3)) as running:
        yield running


def one_forced_call(client: openai.OpenAI, **kw: Any) -> Any:
    """A ``required`` tool choice asking for one call."""
    return client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        **kw,
    )


def _arguments_validate(call: Any) -> None:
    schema = WEATHER if call.function.name == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_arrives_as_tool_calls_whose_arguments_validate(
    server: Running, choice: Any
) -> None:
    client = server.client()
    answer = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=200
    )
    choice0 = answer.choices[0]
    assert choice0.finish_reason == "tool_calls"
    assert choice0.message.content is None
    (call,) = choice0.message.tool_calls
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    _arguments_validate(call)


def test_a_streamed_tool_call_comes_as_argument_deltas_while_it_is_written(server: Running) -> None:
    """OpenAI's shape: a first delta with the id, the type and the name, then pieces of the
    arguments as they are generated; joined, they are the whole reply's call."""
    client = server.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice=named,
        parallel_tool_calls=False,
        max_tokens=200,
        stream=True,
    )
    deltas = [chunk.choices[0] for chunk in stream if chunk.choices]
    pieces = [c for d in deltas for c in (d.delta.tool_calls or [])]
    assert {c.index for c in pieces} == {0}
    assert pieces[0].id.startswith("call_") and pieces[0].type == "function" and pieces[0].function.name
    assert all(c.id is None and c.function.name is None for c in pieces[1:])
    assert len(pieces) > 3  # streamed while written, not whole at the end
    assert not "".join(d.delta.content or "" for d in deltas)  # no call syntax leaks as text
    assert deltas[-1].finish_reason == "tool_calls"
    arguments = "".join(c.function.arguments or "" for c in pieces)
    whole = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=200
    )
    call = whole.choices[0].message.tool_calls[0]
    assert (pieces[0].function.name, arguments) == (call.function.name, call.function.arguments)
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_a_tool_result_continues_the_conversation(server: Running) -> None:
    client = server.client()
    first = one_forced_call(client)
    message = first.choices[0].message
    call = message.tool_calls[0]
    history = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=8)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the question's prompt was still in the KV cache (the template re-renders the answered
    # turn its own way, so the reuse ends where the assistant turn begins)
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    *_, tool_turn, answer = server.served.session.engine.history
    assert (tool_turn.role, tool_turn.content, tool_turn.tool_call_id) == ("tool", "sunny", call.id)
    assert answer.role == "assistant"


def test_a_json_schema_reply_parses_and_validates(server: Running) -> None:
    client = server.client()
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}, "tag": {"enum": ["x", "y"]}},
        "required": ["ok", "n", "tag"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    for stream in (False, True):
        if stream:
            chunks = client.chat.completions.create(
                model="m", messages=ASK, response_format=fmt, max_tokens=100, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = (
                client.chat.completions.create(model="m", messages=ASK, response_format=fmt, max_tokens=100)
                .choices[0]
                .message.content
            )
        jsonschema.validate(json.loads(text), schema)


def test_top_logprobs_are_a_distributions_top_and_streamed_the_same(server: Running) -> None:
    client = server.client()
    whole = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=6, logprobs=True, top_logprobs=5
    )
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and len(tops) == 5
        assert sum(math.exp(x) for x in tops) <= 1.0
        assert entry.logprob == tops[0]  # greedy: the chosen token is the most likely
    stream = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=6, logprobs=True, top_logprobs=5, stream=True
    )
    streamed = [
        e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    text = client.completions.create(model="m", prompt="The quick", max_tokens=4, logprobs=3)
    assert len(text.choices[0].logprobs.token_logprobs) == 4
    assert all(len(top) == 3 for top in text.choices[0].logprobs.top_logprobs)


def test_penalties_and_logit_bias_change_the_draw_through_llamacpps_samplers(server: Running) -> None:
    client = server.client()
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, logprobs=True)
    first = plain.choices[0].logprobs.content[0]
    token_id = server.served.session.engine.backend.tokenize(first.token)  # type: ignore[attr-defined]
    banned = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=12, logprobs=True, logit_bias={str(token_id[-1]): -100}
    )
    assert banned.choices[0].logprobs.content[0].token != first.token
    penalised = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, frequency_penalty=2.0)
    again = client.chat.completions.create(model="m", messages=ASK, max_tokens=12, frequency_penalty=2.0)
    assert penalised.choices[0].message.content == again.choices[0].message.content  # deterministic


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "n",
                        "schema": {
                            "type": "object",
                            "properties": {"tags": {"type": "array", "uniqueItems": True}},
                        },
                    },
                }
            },
            "invalid_grammar",
            "response_format.json_schema.schema#/properties/tags/uniqueItems",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}],
                "tool_choice": "required",
            },
            "invalid_grammar",
            "tools[0].function.parameters#/not",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            None,
            "tool_choice",
        ),
        ({"n": 2}, "unsupported_parameter", "n"),
        ({"top_logprobs": 30, "logprobs": True}, None, "top_logprobs"),
    ],
)
def test_refused_shapes_get_openai_shaped_errors(
    server: Running, body: dict[str, Any], code: str | None, param: str
) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **body)
    assert info.value.status_code == 400
    assert info.value.body["code"] == code  # type: ignore[index]
    assert info.value.body["param"] == param  # type: ignore[index]
