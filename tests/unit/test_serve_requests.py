"""Request bodies of the OpenAI-compatible server, parsed and refused (no model)."""

from __future__ import annotations

from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideRequest
from bmoe.errors import RequestError
from bmoe.requests.api_requests import SEED_MAX, parse_chat_completion, parse_completion, parse_decide
from bmoe.requests.fields import body_object
from bmoe.requests.neutral import ChatRequest, Generation, Sampling

USER = {"role": "user", "content": "Hi"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


def refused(parse: Any, body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse(body)
    return info.value


def test_a_full_chat_request_reads_every_supported_field() -> None:
    asked = parse_chat_completion(
        chat(
            messages=[
                {"role": "developer", "content": "Be brief."},
                USER,
                {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            max_tokens=9,
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            seed=7,
            stop=["\n", "END"],
            stream=True,
            stream_options={"include_usage": True},
            chat_template_kwargs={"enable_thinking": False},
            user="someone",  # ignored
            n=1,
            frequency_penalty=0,
            presence_penalty=0.0,
            logprobs=False,
            tools=[],
            response_format={"type": "text"},
        )
    )
    assert asked == ChatRequest(
        messages=(
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Hi"),
            ChatMessage("assistant", "Hello", "greet"),
            ChatMessage("user", "a\nb"),
        ),
        think=False,
        generation=Generation(
            model="m",
            max_tokens=9,
            sampling=Sampling(temperature=0.5, top_p=0.9, top_k=20, seed=7),
            stop=("\n", "END"),
            stream=True,
            include_usage=True,
        ),
    )


def test_a_minimal_chat_request_leaves_everything_to_the_server() -> None:
    asked = parse_chat_completion({"messages": [USER], "temperature": None, "stop": None})
    assert asked.generation == Generation()
    assert asked.think is None


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    asked = parse_chat_completion(chat(max_tokens=5, max_completion_tokens=3))
    assert asked.generation.max_tokens == 3


def test_a_single_stop_string_is_a_list_of_one() -> None:
    assert parse_chat_completion(chat(stop="x")).generation.stop == ("x",)


def test_an_assistant_message_may_have_null_content() -> None:
    asked = parse_chat_completion(chat(messages=[USER, {"role": "assistant", "content": None}, USER]))
    assert asked.messages[1] == ChatMessage("assistant", "")


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"temperature": "hot"}, "temperature", "'temperature' must be a number, got string"),
        ({"temperature": 2.5}, "temperature", "'temperature' must be in [0, 2], got 2.5"),
        ({"temperature": True}, "temperature", "must be a number, got boolean"),
        ({"top_p": 1.5}, "top_p", "'top_p' must be in [0, 1]"),
        ({"max_tokens": 1.0}, "max_tokens", "'max_tokens' must be an integer, got float"),
        ({"max_tokens": -1}, "max_tokens", "'max_tokens' must be >= 0, got -1"),
        ({"seed": -1}, "seed", "'seed' must be in [0, 4294967294]"),
        ({"seed": SEED_MAX + 1}, "seed", "'seed' must be in"),
        ({"stop": ["a", 1]}, "stop", "'stop' must be a string or a list of strings"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "must not be empty"),
        ({"stream": "yes"}, "stream", "'stream' must be a boolean, got string"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": "Hi"}, "messages", "non-empty list"),
        (
            {"messages": [USER, {"role": "assistant", "content": "x"}]},
            "messages",
            "the last message must be a user",
        ),
        ({"messages": [{"role": "robot", "content": "x"}, USER]}, "messages[0].role", "must be one of"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "a string or a list"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "a string or a list"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages[0].content[0]",
            "only text and image_url parts",
        ),
        ({"chat_template_kwargs": {"enable_thinking": 1}}, "enable_thinking", "must be a boolean"),
    ],
)
def test_a_bad_field_is_named(fields: dict[str, Any], param: str, message: str) -> None:
    error = refused(parse_chat_completion, chat(**fields))
    assert error.param == param
    assert message in str(error)


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 2},
        {"functions": [{"name": "f"}]},
        {"function_call": "auto"},
        {"modalities": ["text", "audio"]},
        {"chat_template_kwargs": {"foo": 1}},
        {"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f"}}, USER]},
    ],
)
def test_what_the_server_cannot_honour_is_refused_not_ignored(fields: dict[str, Any]) -> None:
    assert refused(parse_chat_completion, chat(**fields)).code == "unsupported_parameter"


def test_a_completion_takes_a_string_or_a_list_of_one() -> None:
    assert parse_completion({"prompt": "abc", "max_tokens": 4}).prompt == "abc"
    assert parse_completion({"prompt": ["abc"]}).prompt == "abc"
    assert refused(parse_completion, {"prompt": ["a", "b"]}).param == "prompt"
    assert refused(parse_completion, {"prompt": [1, 2, 3]}).param == "prompt"
    assert refused(parse_completion, {"prompt": ""}).param == "prompt"
    assert refused(parse_completion, {}).param == "prompt"
    assert refused(parse_completion, {"prompt": "a", "echo": True}).code == "unsupported_parameter"
    assert refused(parse_completion, {"prompt": "a", "best_of": 3}).code == "unsupported_parameter"


def test_a_decide_request_mirrors_the_protocol() -> None:
    assert parse_decide({"prefix": "p", "suffix": "s", "choices": ["A", "B"], "reuse_prefix": False}) == (
        DecideRequest(prefix="p", suffix="s", choices=("A", "B"), reuse_prefix=False)
    )
    assert parse_decide({"model": "m", "suffix": "s", "choices": ["A"]}).reuse_prefix


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"suffix": "s", "choices": ["A"], "reuse": True}, "reuse", "unknown field 'reuse'"),
        ({"suffix": "s"}, "choices", "'choices' must be a list of strings"),
        ({"suffix": "s", "choices": []}, "choices", "empty choices list"),
        ({"suffix": "s", "choices": ["A", ""]}, "choices", "empty choice at index 1"),
        ({"choices": ["A"]}, "suffix", "prefix and suffix are both empty"),
        ({"prefix": 1, "choices": ["A"]}, "prefix", "'prefix' must be a string"),
    ],
)
def test_a_bad_decide_request_is_named(body: dict[str, Any], param: str, message: str) -> None:
    error = refused(parse_decide, body)
    assert error.param == param
    assert message in str(error)


def test_a_body_must_be_an_object() -> None:
    with pytest.raises(RequestError, match="must be a JSON object, got array"):
        body_object([])
