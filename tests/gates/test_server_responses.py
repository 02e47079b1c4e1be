"""OpenAI's Responses API (``POST /v1/responses``) on the tiny fixtures, driven by the
official ``openai`` client's ``responses`` resource: a plain answer (the one the session
generates), streamed (the event sequence, numbered), a thinking model's reasoning item, a
function-tool loop, ``responses.parse`` with a pydantic model, ``previous_response_id``,
the stored responses and the input-token count, and errors in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from test_server import LONG, Running, direct, serving  # the in-process server of test_server.py

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER},
    {"type": "web_search"},  # a hosted tool: skipped, the request still served
]


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "1024", "--chat-template-file", str(QWEN3)) as running:
        yield running


def test_a_response_is_what_the_session_generates_whole_or_streamed(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    with serving(model, *LONG) as s:
        client = s.client()
        whole = client.responses.create(
            model="t", instructions="Answer briefly.", input="Hello there", max_output_tokens=12
        )
        events = list(
            client.responses.create(
                model="t",
                instructions="Answer briefly.",
                input="Hello there",
                max_output_tokens=12,
                stream=True,
            )
        )
    with direct(model, *LONG) as session:
        ref = session.generate(
            GenerateRequest("Hello there", n_predict=12, clear_kv=False),
            history=[ChatMessage("system", "Answer briefly.")],
        )
    assert whole.output_text == ref.text
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (ref.n_past - 12, 12)
    assert whole.instructions == "Answer briefly." and whole.id.startswith("resp_")
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ref.text
    last = events[-1].response
    assert last.output_text == ref.text and last.usage is not None and last.usage.output_tokens == 12


def test_a_thinking_model_answers_with_a_reasoning_item(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe-think")) as s:
        client = s.client()
        thought = client.responses.create(
            model="t", input="Should I bring an umbrella?", max_output_tokens=32
        )
        streamed = list(
            client.responses.create(
                model="t", input="Should I bring an umbrella?", max_output_tokens=32, stream=True
            )
        )
        off = client.responses.create(
            model="t", input="Should I bring an umbrella?", max_output_tokens=32, reasoning={"effort": "none"}
        )
    assert thought.status == "completed"
    reasoning, message = thought.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == f"\n{THINK_REASONING}\n"
    assert message.type == "message" and thought.output_text == THINK_ANSWER
    thinking = "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta")
    assert thinking == f"\n{THINK_REASONING}\n"
    assert streamed[-1].type == "response.completed"
    assert [item.type for item in off.output] == ["message"] and off.output_text == THINK_ANSWER


def test_a_function_tool_loop_with_function_call_output(server: Running) -> None:
    client = server.client()
    ask: Any = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.responses.create(
        model="m",
        input=ask,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert first.tools[0].name == "get_weather" and len(first.tools) == 1  # the hosted tool skipped
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(
        model="m", input=[*ask, call.model_dump(exclude_none=True), result], tools=TOOLS, max_output_tokens=8
    )
    assert second.status in ("completed", "incomplete")
    *_, tool_turn, answer = server.served.session.engine.history
    assert (tool_turn.role, tool_turn.content, tool_turn.tool_call_id) == ("tool", "sunny", call.call_id)
    assert answer.role == "assistant"
    # the same turn, continuing the stored first response instead of sending it back
    chained = client.responses.create(
        model="m", input=[result], previous_response_id=first.id, tools=TOOLS, max_output_tokens=8
    )
    assert chained.output_text == second.output_text
    assert chained.usage is not None and second.usage is not None
    assert chained.usage.input_tokens == second.usage.input_tokens

    named = client.responses.create(
        model="m",
        input=ask,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=200,
        stream=True,
    )
    events = list(named)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(pieces) > 3 and len(done) == 1  # streamed while written
    assert "".join(pieces) == done[0].arguments
    jsonschema.validate(json.loads(done[0].arguments), WEATHER)


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    rain: bool


def test_responses_parse_fills_a_pydantic_model(server: Running) -> None:
    client = server.client()
    parsed = client.responses.parse(
        model="m", input="Weather in Paris?", text_format=Weather, max_output_tokens=100
    )
    assert isinstance(parsed.output_parsed, Weather)
    assert parsed.output_parsed == Weather.model_validate_json(parsed.output_text)


def test_previous_response_id_continues_a_stored_conversation(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    with serving(model, *LONG) as s, serving(model, *LONG) as fresh:
        client = s.client()
        first = client.responses.create(model="t", input="Hello there", max_output_tokens=8)
        second = client.responses.create(
            model="t", input="And then?", previous_response_id=first.id, max_output_tokens=8
        )
        whole: Any = [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"},
        ]
        cold = fresh.client().responses.create(model="t", input=whole, max_output_tokens=8)
        counted = client.responses.input_tokens.count(model="t", input=whole)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        assert client.responses.delete(first.id) is None
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError) as info:
            client.responses.create(model="t", input="More", previous_response_id=first.id)
        not_kept = client.responses.create(model="t", input="Hi", store=False, max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(not_kept.id)
    assert second.output_text == cold.output_text
    assert second.usage is not None and cold.usage is not None
    assert second.usage.input_tokens == cold.usage.input_tokens == counted.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's KV was kept
    assert info.value.body is not None
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_errors_come_in_openais_shape_naming_the_field(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe")) as s:
        client = s.client()
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="t", input="Hi", temperature=7)
        assert info.value.param == "temperature"  # type: ignore[attr-defined]
        image: Any = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="t", input=image)
        assert refused.value.code == "unsupported_parameter"
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as long:
                client.responses.create(model="t", input="word " * 600, stream=stream)
            assert long.value.code == "context_length_exceeded"
        # max_output_tokens is a most: past the context, the answer ends where the context does
        cut = client.responses.create(model="t", input="Hi", max_output_tokens=5000)
        assert cut.usage is not None and cut.usage.input_tokens + cut.usage.output_tokens in (511, 512)
        empty = httpx.post(f"{s.url}/responses", json={"model": "t"})
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"
