"""OpenAI requests as bmoe's GenerateRequest and SamplingParams (no model)."""

from __future__ import annotations

import attrs
import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.tools import ToolCall
from bmoe.errors import RequestError
from bmoe.requests.api_requests import parse_chat_completion, parse_completion
from bmoe.requests.mapping import (
    ServeDefaults,
    chat_turn,
    completion_request,
    fewest_tokens,
    fill_context,
    message_texts,
    sampling_params,
)
from bmoe.requests.neutral import ChatRequest, Generation, Sampling

DEFAULTS = ServeDefaults(sampling=SamplingParams(temp=0.0, top_k=40, top_p=0.95, seed=3), max_tokens=None)


def test_each_sampling_setting_left_unsaid_comes_from_the_server() -> None:
    assert sampling_params(Sampling(), DEFAULTS.sampling) == DEFAULTS.sampling
    assert sampling_params(Sampling(temperature=0.7, seed=9), DEFAULTS.sampling) == SamplingParams(
        temp=0.7, top_k=40, top_p=0.95, seed=9
    )
    assert sampling_params(Sampling(top_p=0.5, top_k=0), DEFAULTS.sampling) == SamplingParams(
        temp=0.0, top_k=0, top_p=0.5, seed=3
    )


def test_a_chat_continues_the_context_with_the_conversation_as_history() -> None:
    asked = parse_chat_completion(
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "U2"},
            ],
            "max_tokens": 5,
            "temperature": 1.0,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    turn = chat_turn(asked, DEFAULTS)
    assert turn.history == (
        ChatMessage("system", "S"),
        ChatMessage("user", "U1"),
        ChatMessage("assistant", "A1"),
    )
    assert turn.request == GenerateRequest(
        prompt="U2",
        n_predict=5,
        think=False,
        clear_kv=False,
        sampling=SamplingParams(temp=1.0, top_k=40, top_p=0.95, seed=3),
    )


def test_max_tokens_left_unsaid_is_the_servers() -> None:
    asked = parse_chat_completion({"messages": [{"role": "user", "content": "U"}]})
    assert chat_turn(asked, DEFAULTS).request.n_predict is None
    assert chat_turn(asked, ServeDefaults(max_tokens=64)).request.n_predict == 64


def test_an_empty_last_user_message_is_refused() -> None:
    asked = parse_chat_completion({"messages": [{"role": "user", "content": ""}]})
    with pytest.raises(RequestError) as info:
        chat_turn(asked, DEFAULTS)
    assert info.value.param == "messages[0].content"


def test_a_completion_is_raw_text_from_an_empty_context() -> None:
    request = completion_request(parse_completion({"prompt": "abc", "seed": 1}), DEFAULTS)
    assert request == GenerateRequest(
        prompt="abc", n_predict=None, clear_kv=True, sampling=SamplingParams(top_k=40, top_p=0.95, seed=1)
    )


def test_fill_context_gives_an_unbounded_request_the_rest_of_the_context() -> None:
    unbounded = GenerateRequest("x")
    assert fill_context(unbounded, n_prompt=100, n_ctx=512).n_predict == 412
    assert fill_context(unbounded, n_prompt=600, n_ctx=512).n_predict == 0  # the session refuses it
    bounded = GenerateRequest("x", n_predict=7)
    assert fill_context(bounded, n_prompt=100, n_ctx=512) is bounded


def test_fill_context_cuts_a_most_to_what_the_context_leaves() -> None:
    unbounded = GenerateRequest("hi", n_predict=None)
    assert fill_context(unbounded, n_prompt=100, n_ctx=512, most=32000).n_predict == 412
    assert fill_context(unbounded, n_prompt=100, n_ctx=512, most=20).n_predict == 20


def test_a_dialect_whose_max_tokens_is_a_most_leaves_n_predict_to_the_context() -> None:
    asked = ChatRequest(
        messages=(ChatMessage("user", "Hi"),), generation=Generation(max_tokens=50, fit_context=True)
    )
    turn = chat_turn(asked, DEFAULTS)
    assert (turn.request.n_predict, turn.most) == (None, 50)
    strict = chat_turn(attrs.evolve(asked, generation=Generation(max_tokens=50)), DEFAULTS)
    assert (strict.request.n_predict, strict.most) == (50, None)


def test_the_fewest_tokens_a_text_can_take_bound_a_prompt_before_tokenizing() -> None:
    assert fewest_tokens(["abcd", "é"], 2) == 3  # 6 bytes, at most 2 a token
    assert fewest_tokens(["abcd"], 0) == 0  # no vocabulary known: no bound
    call = ToolCall("c", "f", '{"a": 1}')
    texts = message_texts([ChatMessage("assistant", "x", "think", (call,)), ChatMessage("tool", "r")])
    assert texts == ["x", "think", 'f{"a": 1}', "r", ""]
