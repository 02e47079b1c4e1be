"""JSON Schema as agent frameworks send it, through the server on the tiny fixture: numeric
bounds and formats enforced (every sampled reply valid, several seeds), tools beside a
response format (``auto``: a call or the answer; forced: the call, the format waiting),
a call cut short by ``max_tokens`` (no markup in the content), OpenAI's ``call_`` ids.

The fixture's weights are random: with ``temperature`` 1 each seed draws another reply,
so validity is the grammar's doing, not the model's.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from test_server import Running, serving
from test_server_agents import ASK, TOOLS, WEATHER

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
SEEDS = range(6)


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "1024", "--chat-template-file", str(QWEN3)) as running:
        yield running


def _json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}


def _reply(server: Running, seed: int, **kw: Any) -> Any:
    return server.client().chat.completions.create(
        model="m", messages=ASK, temperature=1.0, seed=seed, max_tokens=200, **kw
    )


BOUNDED = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 40},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "step": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 50},
        "extra": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 2,
            "patternProperties": {"^[a-z]{1,3}$": {"type": "boolean"}},
            "additionalProperties": False,
        },
    },
    "required": ["count", "ratio", "step", "extra"],
}


@pytest.mark.parametrize("seed", SEEDS)
def test_numeric_bounds_and_property_counts_hold_in_every_draw(server: Running, seed: int) -> None:
    text = _reply(server, seed, response_format=_json_format(BOUNDED)).choices[0].message.content
    jsonschema.validate(json.loads(text), BOUNDED)


def test_the_issues_example_body_answers_within_its_bound(server: Running) -> None:
    schema = {"type": "object", "properties": {"count": {"type": "integer", "minimum": 1}}}
    for seed in SEEDS:
        text = _reply(server, seed, response_format=_json_format(schema)).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


FORMATS: dict[str, Callable[[str], object]] = {
    "date": datetime.date.fromisoformat,
    "date-time": datetime.datetime.fromisoformat,
    "time": datetime.time.fromisoformat,
    "uuid": uuid.UUID,
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_formats_are_valid_values_not_only_their_shape(server: Running, fmt: str) -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}
    for seed in SEEDS:
        text = _reply(server, seed, response_format=_json_format(schema)).choices[0].message.content
        FORMATS[fmt](json.loads(text)["v"])  # raises on an impossible date, hour, uuid


ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_auto_tools_beside_a_response_format_give_a_call_or_the_answer(server: Running) -> None:
    """Both branches of one grammar: every draw is a valid call or a valid answer."""
    kinds = set()
    for seed in range(12):
        message = _reply(server, seed, tools=TOOLS, response_format=_json_format(ANSWER)).choices[0].message
        if message.tool_calls:
            kinds.add("call")
            assert message.tool_calls[0].function.name in ("get_weather", "get_time")
            if message.tool_calls[0].function.name == "get_weather":
                jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), WEATHER)
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(message.content), ANSWER)
    assert kinds  # which branches the random weights take is theirs; each one taken is valid


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_beside_a_response_format_is_the_call(server: Running, choice: Any) -> None:
    answer = _reply(
        server,
        0,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        response_format=_json_format(ANSWER),
    )
    (call,) = answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.id.startswith("call_")
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_comes_as_a_partial_call_not_markup(server: Running, stream: bool) -> None:
    client = server.client()
    kw: dict[str, Any] = dict(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=45,
    )
    if stream:
        chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        content = "".join(c.delta.content or "" for c in chunks)
        pieces = [call for c in chunks for call in (c.delta.tool_calls or [])]
        assert {p.index for p in pieces} == {0}
        pieces[0].function.arguments = "".join(p.function.arguments or "" for p in pieces)  # joined
        calls, finish = pieces[:1], chunks[-1].finish_reason
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content, calls, finish = (
            choice.message.content or "",
            choice.message.tool_calls or [],
            choice.finish_reason,
        )
    assert finish == "length"
    assert "<tool_call>" not in content and '"name"' not in content
    (call,) = calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert call.function.arguments.startswith("{")  # the arguments as far as they went
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)


def test_thinking_with_a_grammar_names_the_field(server: Running) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=4,
            response_format={"type": "json_object"},
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
    assert info.value.body["param"] == "chat_template_kwargs.enable_thinking"  # type: ignore[index]


def test_parallel_calls_stream_each_under_its_index_joined_as_the_whole_reply(server: Running) -> None:
    client = server.client()
    kw: dict[str, Any] = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    joined: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if piece.id:
                assert piece.index == len(joined) and piece.id.startswith("call_")
                joined[piece.index] = [piece.function.name, piece.function.arguments or ""]
            else:
                joined[piece.index][1] += piece.function.arguments or ""
    assert len(whole) > 1  # the random weights write several calls under "required"
    assert [joined[i] for i in sorted(joined)] == [[c.function.name, c.function.arguments] for c in whole]
