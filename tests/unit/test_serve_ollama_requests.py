"""Ollama's ``/api/chat`` and ``/api/generate`` bodies read into the neutral request (no
model, no HTTP): messages, images, tool calls and their results, options, format, think,
probes, model names, and what is refused by name."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.media import MEDIA_MARKER
from bmoe.domain.tools import ToolCall
from bmoe.errors import RequestError
from bmoe.requests.mapping import ServeDefaults, chat_turn
from bmoe.serve.ollama_requests import parse_chat, parse_generate, same_model, tagged_name

PICTURE = base64.b64encode(b"\x89PNG not really").decode()
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], **fields}


def test_a_conversation_with_calls_results_and_images_becomes_chat_messages() -> None:
    asked = parse_chat(
        {
            "model": "tiny:latest",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?", "images": [PICTURE]},
                {
                    "role": "assistant",
                    "thinking": "a call",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                        {"function": {"name": "get_time", "arguments": "{}"}},
                    ],
                },
                {"role": "tool", "content": "12:00", "tool_name": "get_time"},
                {"role": "tool", "content": "rain"},
            ],
            "tools": [TOOL],
        }
    )
    assert asked.chat is not None and asked.stream  # Ollama streams unless told not to
    system, user, assistant, time_result, weather_result = asked.chat.messages
    assert system == ChatMessage("system", "Be brief.")
    assert user.content == f"{MEDIA_MARKER}\nWeather?" and len(user.images) == 1
    assert user.images[0].data == b"\x89PNG not really"
    assert assistant == ChatMessage(
        "assistant",
        "",
        "a call",
        (ToolCall("call_2_0", "get_weather", '{"city": "Oslo"}'), ToolCall("call_2_1", "get_time", "{}")),
    )
    assert (time_result.role, time_result.tool_call_id) == ("tool", "call_2_1")  # by its tool_name
    assert weather_result.tool_call_id == "call_2_0"  # the first call left unanswered
    assert asked.chat.tools is not None and asked.chat.tools.tools[0].name == "get_weather"
    assert asked.chat.generation.fit_context  # num_predict is a most, as Ollama never refuses it


def test_options_map_to_sampling_limits_and_stop_strings() -> None:
    asked = parse_chat(
        chat(
            stream=False,
            options={
                "temperature": 0.7,
                "top_k": 20,
                "top_p": 0.8,
                "min_p": 0.05,
                "seed": 42,
                "num_predict": 12,
                "num_ctx": 32768,  # read, changes nothing
                "stop": ["\n\n"],
                "repeat_penalty": 1.1,
                "num_gpu": 99,  # a load-time option: ignored
                "mirostat": 2,
                "made_up": "x",  # Ollama ignores options it does not know
            },
            keep_alive="5m",
        )
    )
    assert asked.chat is not None and not asked.stream
    gen = asked.chat.generation
    assert (gen.max_tokens, gen.stop) == (12, ("\n\n",))
    s = gen.sampling
    assert (s.temperature, s.top_k, s.top_p, s.seed) == (0.7, 20, 0.8, 42)
    assert s.knobs == {"min_p": 0.05, "repeat_penalty": 1.1, "penalty_last_n": 64}
    request = chat_turn(asked.chat, ServeDefaults()).request
    assert (request.sampling.min_p, request.sampling.repeat_penalty, request.sampling.penalty_last_n) == (
        0.05,
        1.1,
        64,
    )


@pytest.mark.parametrize(("predict", "most"), [(-1, None), (-2, None), (0, 0), (5, 5)])
def test_num_predict_minus_one_or_two_means_until_the_context_is_full(predict: int, most: int | None) -> None:
    asked = parse_chat(chat(options={"num_predict": predict}))
    assert asked.chat is not None and asked.chat.generation.max_tokens == most


def test_a_negative_seed_leaves_the_servers_and_a_window_of_minus_one_is_the_context() -> None:
    asked = parse_chat(chat(options={"seed": -1, "presence_penalty": 0.5, "repeat_last_n": -1}))
    assert asked.chat is not None
    assert asked.chat.generation.sampling.seed is None
    assert asked.chat.generation.sampling.knobs == {"presence_penalty": 0.5, "penalty_last_n": -1}


def test_format_json_or_a_schema_is_a_constraint_and_think_switches_thinking() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    as_json = parse_chat(chat(format="json", think=False)).chat
    as_schema = parse_chat(chat(format=schema, think="high")).chat
    assert as_json is not None and as_json.generation.constraint == OutputConstraint("json_object")
    assert as_json.think is False
    assert as_schema is not None and as_schema.generation.constraint == OutputConstraint.json_schema(schema)
    assert as_schema.think is True
    plain = parse_chat(chat(format="")).chat
    assert plain is not None and plain.generation.constraint is None and plain.think is None


def test_logprobs_ask_for_the_top_alternatives() -> None:
    asked = parse_chat(chat(logprobs=True, top_logprobs=3)).chat
    assert asked is not None and asked.generation.logprobs == 3
    assert parse_chat(chat(logprobs=False, top_logprobs=3)).chat.generation.logprobs is None  # type: ignore[union-attr]


def test_no_messages_or_no_prompt_is_a_load_probe_and_keep_alive_zero_an_unload() -> None:
    assert parse_chat({"model": "tiny", "messages": []}).probe == "load"
    assert parse_chat({"model": "tiny"}).probe == "load"
    assert parse_generate({"model": "tiny", "keep_alive": 0}).probe == "unload"
    assert parse_generate({"model": "tiny", "prompt": "", "keep_alive": "0s"}).probe == "unload"


def test_generate_is_one_user_message_with_its_system_and_images_or_raw_text() -> None:
    asked = parse_generate({"model": "tiny", "prompt": "Hi", "system": "Be brief.", "images": [PICTURE]})
    assert asked.chat is not None and asked.raw is None
    system, user = asked.chat.messages
    assert system == ChatMessage("system", "Be brief.")
    assert user.content == f"{MEDIA_MARKER}\nHi" and len(user.images) == 1
    raw = parse_generate({"model": "tiny", "prompt": "Once upon", "raw": True, "options": {"num_predict": 4}})
    assert raw.chat is None and raw.raw is not None
    assert (raw.raw.prompt, raw.raw.generation.max_tokens) == ("Once upon", 4)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "model"),
        (chat(messages=[{"role": "robot", "content": "Hi"}]), "messages[0].role"),
        (chat(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (chat(messages=[{"role": "system", "content": "x", "images": [PICTURE]}]), "messages[0].images"),
        (chat(messages=[{"role": "user", "content": "x", "images": ["%%%"]}]), "messages[0].images[0]"),
        (chat(messages=[{"role": "assistant", "content": "I"}]), "messages"),  # no prefill of a reply
        (
            chat(
                messages=[
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (chat(options={"temperature": -1}), "options.temperature"),
        (chat(options={"top_p": 2}), "options.top_p"),
        (chat(options={"min_p": 1.5}), "options.min_p"),
        (chat(options={"repeat_penalty": 0}), "options.repeat_penalty"),
        (chat(options={"num_predict": -3}), "options.num_predict"),
        (chat(options={"stop": [""]}), "options.stop"),
        (chat(options=[1]), "options"),
        (chat(format="xml"), "format"),
        (chat(think="very"), "think"),
        (chat(keep_alive=[]), "keep_alive"),
        (chat(stream="yes"), "stream"),
        (chat(tools=[{"type": "function"}]), "tools[0]"),
        ({"model": "tiny", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "tiny", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
        ({"model": "tiny", "prompt": "x", "context": [1, 2]}, "context"),
        ({"model": "tiny", "prompt": "x", "raw": True, "images": [PICTURE]}, "images"),
    ],
)
def test_what_cannot_be_read_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    parse = parse_generate if "prompt" in body else parse_chat
    with pytest.raises(RequestError) as err:
        parse(body)
    assert err.value.param is not None and err.value.param.startswith(param), (err.value, err.value.param)


def test_model_names_resolve_with_or_without_latest() -> None:
    assert tagged_name("qwen3") == "qwen3:latest" and tagged_name("qwen3:30b") == "qwen3:30b"
    assert same_model("qwen3", "qwen3") and same_model("qwen3:latest", "qwen3")
    assert same_model("Qwen3:Latest", "qwen3") and same_model("qwen3", "qwen3:latest")
    assert same_model("qwen3:30b", "qwen3:30b") and not same_model("qwen3", "qwen3:30b")
    assert not same_model("llama3.2", "qwen3") and not same_model("qwen3:8b", "qwen3")


def test_tool_call_arguments_are_kept_as_json_text() -> None:
    asked = parse_chat(
        chat(
            messages=[
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c9", "function": {"name": "f", "arguments": {"é": 1}}}],
                },
                {"role": "tool", "content": "ok", "tool_call_id": "c9"},
            ]
        )
    )
    assert asked.chat is not None
    (call,) = asked.chat.messages[1].tool_calls
    assert (call.id, json.loads(call.arguments)) == ("c9", {"é": 1})
    assert asked.chat.messages[2].tool_call_id == "c9"
