"""Anthropic's Messages API (``POST /v1/messages``) on the tiny fixtures, driven by the
official ``anthropic`` SDK: a message (the one the session generates), streamed (the event
sequence, the SDK's own stream helper), a tool loop with ``tool_use``/``tool_result``,
``count_tokens``, thinking on a thinking template, stop sequences, a structured output
through ``messages.parse``, and errors in Anthropic's shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import pydantic
import pytest
from test_server import LONG, Running, direct, serving  # the in-process server of test_server.py

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
TIMEOUT = 30.0
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"name": "get_weather", "description": "The weather", "input_schema": WEATHER},
    {"type": "web_search_20250305", "name": "web_search"},  # a server tool: skipped
]
HELLO: Any = [{"role": "user", "content": "Hello there"}]


def client_of(running: Running, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=running.url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=TIMEOUT
    )


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "1024", "--chat-template-file", str(QWEN3)) as running:
        yield running


def test_a_message_is_what_the_session_generates_whole_or_streamed(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    with serving(model, *LONG) as s:
        client = client_of(s)
        whole = client.messages.create(model="tiny", system="Answer briefly.", messages=HELLO, max_tokens=12)
        events = list(
            client.messages.create(
                model="tiny", system="Answer briefly.", messages=HELLO, max_tokens=12, stream=True
            )
        )
        with client.messages.stream(
            model="tiny", system=[{"type": "text", "text": "Answer briefly."}], messages=HELLO, max_tokens=12
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    with direct(model, *LONG) as session:
        ref = session.generate(
            GenerateRequest("Hello there", n_predict=12, clear_kv=False),
            history=[ChatMessage("system", "Answer briefly.")],
        )
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == ref.text  # type: ignore[union-attr]
    assert (whole.stop_reason, whole.stop_sequence, whole.model) == ("max_tokens", None, "tiny")
    assert whole.usage.output_tokens == 12
    assert whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) == ref.n_past - 12
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    assert [e.type for e in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert "".join(deltas) == ref.text
    assert text == ref.text and final.stop_reason == "max_tokens" and final.usage.output_tokens == 12


def test_thinking_comes_as_a_thinking_block_and_can_be_switched_off(tiny_model_path: TinyModelPath) -> None:
    ask: Any = [{"role": "user", "content": "Should I bring an umbrella?"}]
    with serving(tiny_model_path("qwen3moe-think")) as s:
        client = client_of(s)
        thought = client.messages.create(
            model="t", messages=ask, max_tokens=32, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        with client.messages.stream(model="t", messages=ask, max_tokens=32) as stream:
            kinds = [e.type for e in stream]
            streamed = stream.get_final_message()
        off = client.messages.create(model="t", messages=ask, max_tokens=32, thinking={"type": "disabled"})
    thinking, answer = thought.content
    assert thinking.type == "thinking" and thinking.thinking == f"\n{THINK_REASONING}\n"
    assert answer.type == "text" and answer.text == THINK_ANSWER
    assert thought.stop_reason == "end_turn"
    assert [b.type for b in streamed.content] == ["thinking", "text"]
    assert streamed.content[0].thinking == thinking.thinking  # type: ignore[union-attr]
    assert "thinking" in kinds and "text" in kinds  # the SDK's own events for the deltas
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == THINK_ANSWER  # type: ignore[union-attr]


def test_a_tool_loop_with_tool_use_and_tool_result(server: Running) -> None:
    client = client_of(server)
    ask: Any = [{"role": "user", "content": "Weather in Paris?"}]
    choice: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    first = client.messages.create(model="m", messages=ask, tools=TOOLS, tool_choice=choice, max_tokens=200)
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sunny"}]}
    history: Any = [
        *ask,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    second = client.messages.create(model="m", messages=history, tools=TOOLS, max_tokens=8)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    *_, tool_turn, answer = server.served.session.engine.history
    assert (tool_turn.role, tool_turn.content, tool_turn.tool_call_id) == ("tool", "sunny", call.id)
    assert answer.role == "assistant"

    with client.messages.stream(
        model="m",
        messages=ask,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        max_tokens=200,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    pieces = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]  # type: ignore[union-attr]
    assert len(pieces) > 3  # streamed while written
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert json.loads("".join(pieces)) == block.input
    jsonschema.validate(block.input, WEATHER)


def test_count_tokens_is_the_prompt_a_message_is_answered_from(server: Running) -> None:
    client = client_of(server)
    ask: Any = [{"role": "user", "content": "Count me, please"}]
    counted = client.messages.count_tokens(model="m", system="Be brief.", messages=ask, tools=TOOLS)
    answered = client.messages.create(model="m", system="Be brief.", messages=ask, tools=TOOLS, max_tokens=2)
    usage = answered.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    bare = client.messages.count_tokens(model="m", messages=ask)
    assert bare.input_tokens < counted.input_tokens  # the tools and the system prompt count


class Weather(pydantic.BaseModel):
    """Bounded fields only: the SDK sends Anthropic's subset of JSON Schema (no maxLength),
    and the fixture's random weights would write a string until max_tokens."""

    unit: Literal["c", "f"]
    rain: bool


def test_a_stop_sequence_and_a_structured_output(server: Running) -> None:
    client = client_of(server)
    ask: Any = [{"role": "user", "content": "Hello"}]
    full = client.messages.create(model="m", messages=ask, max_tokens=16)
    text = full.content[0].text  # type: ignore[union-attr]
    assert len(text) >= 8
    stop = text[4:7]
    cut = client.messages.create(model="m", messages=ask, max_tokens=16, stop_sequences=[stop])
    assert cut.content[0].text == text[: text.find(stop)]  # type: ignore[union-attr]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    parsed = client.messages.parse(model="m", messages=ask, max_tokens=100, output_format=Weather)
    assert isinstance(parsed.parsed_output, Weather)
    assert parsed.parsed_output == Weather.model_validate_json(parsed.content[0].text)  # type: ignore[union-attr]


def test_errors_come_in_anthropics_shape(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe")) as s:
        client = client_of(s)
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(
                model="t", messages=[{"role": "user", "content": "word " * 600}], max_tokens=8
            )
        assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "exceeds the context" in info.value.message
        document: Any = [
            {"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "x"}}]}
        ]
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="t", messages=document, max_tokens=4)
        assert "'document'" in refused.value.message
        image: Any = [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="t", messages=image, max_tokens=4)
        assert "content[0].source.url" in refused.value.message  # an image, not a picture
        missing = httpx.post(f"{s.url}/messages", json={"model": "t", "messages": HELLO}, timeout=TIMEOUT)
        assert missing.status_code == 400
        assert missing.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"},
        }
        after = client.messages.create(model="t", messages=HELLO, max_tokens=2)
        # max_tokens as Claude Code sends it, past the context: the answer ends where the context does
        cut = client.messages.create(model="t", messages=HELLO, max_tokens=32000)
    assert after.usage.output_tokens == 2
    assert cut.stop_reason in ("max_tokens", "end_turn")
    used = cut.usage.input_tokens + (cut.usage.cache_read_input_tokens or 0) + cut.usage.output_tokens
    assert used in (511, 512) or cut.stop_reason == "end_turn"


def test_dialects_side_by_side_under_np_each_answered_as_alone(tiny_model_path: TinyModelPath) -> None:
    """One request core: a message, a response and a chat completion batched together under
    ``-np 3`` get the answers each gets alone."""
    model = tiny_model_path("qwen3moe")

    def ask_all(running: Running) -> list[str]:
        claude = client_of(running)
        oai = running.client()

        def message() -> str:
            reply = claude.messages.create(model="t", messages=HELLO, max_tokens=10)
            return reply.content[0].text  # type: ignore[union-attr]

        def response() -> str:
            return oai.responses.create(model="t", input="Hello there", max_output_tokens=10).output_text

        def chat() -> str:
            answer = oai.chat.completions.create(model="t", messages=HELLO, max_tokens=10)
            return answer.choices[0].message.content or ""

        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(f) for f in (message, response, chat)]
            return [f.result() for f in futures]

    with serving(model, *LONG, "-np", "3") as s:
        together = ask_all(s)
    with serving(model, *LONG) as alone:
        one_by_one = ask_all(alone)
    assert together == one_by_one
    assert together[0] == together[1] == together[2]  # one prompt, one answer, three dialects


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_a_client_that_leaves_a_stream_cancels_its_request_in_either_dialect(
    tiny_model_path: TinyModelPath, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn is held at its third token until a cancel reaches the session; the next
    request is answered as a fresh server answers it."""
    model = tiny_model_path("qwen3moe")
    results: list[RunResult] = []
    cancelled = threading.Event()
    with serving(model, *LONG) as s:
        session = s.served.session
        real_generate, real_cancel = session.generate, session.cancel

        def cancel() -> None:
            cancelled.set()
            real_cancel()

        def generate(request: Any, on_progress: Any = None, on_begin: Any = None, **kw: Any) -> RunResult:
            def progress(p: Any) -> None:
                on_progress(p)
                if p.step == 3:
                    cancelled.wait(TIMEOUT)

            result = real_generate(request, progress, on_begin, **kw)
            results.append(result)
            return result

        monkeypatch.setattr(session, "generate", generate)
        monkeypatch.setattr(session, "cancel", cancel)
        if dialect == "messages":
            stream: Any = client_of(s).messages.create(model="t", messages=HELLO, max_tokens=900, stream=True)
        else:
            stream = s.client().responses.create(
                model="t", input="Hello there", max_output_tokens=900, stream=True
            )
        next(iter(stream))
        stream.close()  # the client goes away
        after = client_of(s).messages.create(model="t", messages=HELLO, max_tokens=8)
    assert cancelled.is_set()
    assert results[0].cancelled and len(results[0].tokens) <= 3
    with serving(model, *LONG) as fresh:
        cold = client_of(fresh).messages.create(model="t", messages=HELLO, max_tokens=8)
    assert after.content == cold.content
