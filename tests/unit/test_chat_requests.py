"""``Session.chat`` over the scripted backend (no model): a call's fields are the body the
server reads, refused as the server refuses them; the turn is the server's mapping on the
session's defaults; the reply is cut at stop strings, streamed in pieces that add up to its
outcome, and a cancel raises. The same call against the server and ``bmoe.Llama`` on a model:
``tests/gates/test_session_chat.py``."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
from test_serve_service import FakeSession  # the scripted session of the server's unit tests

from bmoe.errors import DecodeAbortedError, RequestError
from bmoe.requests.api_requests import parse_chat_completion
from bmoe.requests.chat_fields import FIELDS, chat_body
from bmoe.requests.mapping import ServeDefaults, chat_turn
from bmoe.requests.neutral import Delta, Outcome
from bmoe.runtime.chat_requests import answer, answer_stream

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]


class ChatSession(FakeSession):
    """The scripted session with the config ``Session.chat`` reads its defaults from."""

    def __init__(self, answer: str, n_predict: int = 32) -> None:
        super().__init__(answer)
        self.config = SimpleNamespace(n_predict=n_predict)


class Recording(dict[str, Any]):
    """A body that notes each field read from it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def test_the_fields_are_those_the_server_reads_of_a_chat_body() -> None:
    body = Recording({"messages": ASK})
    parse_chat_completion(body)
    # llama.cpp's "speculative.n_max" is no Python name: a library caller sets
    # GenerateRequest.draft (or the session's --draft) instead
    assert body.read - {"messages", "model", "stream", "stream_options", "speculative.n_max"} == FIELDS


def test_a_call_s_fields_are_the_body_the_server_reads() -> None:
    fields: dict[str, Any] = {
        "max_tokens": 5,
        "temperature": 0.5,
        "stop": ["\n"],
        "logit_bias": {"7": -100},
        "response_format": {"type": "json_object"},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert parse_chat_completion(chat_body(ASK, fields)) == parse_chat_completion({"messages": ASK, **fields})


def test_messages_may_be_any_mappings_in_any_sequence() -> None:
    messages = tuple(MappingProxyType(m) for m in ASK)
    assert parse_chat_completion(chat_body(messages, {})) == parse_chat_completion({"messages": ASK})


def test_a_name_that_is_not_a_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="'max_token'"):
        chat_body(ASK, {"max_token": 5})
    with pytest.raises(TypeError, match="chat_stream"):
        chat_body(ASK, {"stream": True})


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"n": 2}, "n", "unsupported_parameter"),
        ({"temperature": 3}, "temperature", None),
        ({"response_format": {"type": "xml"}}, "response_format", None),
        ({"top_logprobs": 2}, "top_logprobs", None),
        ({"tool_choice": "required"}, "tool_choice", None),
    ],
)
def test_a_refused_field_raises_the_request_error_the_server_answers(
    fields: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(RequestError) as caught:
        answer(ChatSession("hi"), ASK, fields)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as served:
        parse_chat_completion({"messages": ASK, **fields})
    assert (caught.value.param, caught.value.code) == (param, code)
    assert (str(caught.value), caught.value.where) == (str(served.value), param)


def test_a_chat_is_the_servers_turn_on_the_session_s_defaults() -> None:
    session = ChatSession("hello", n_predict=7)
    outcome = answer(session, ASK, {"temperature": 0.5})  # type: ignore[arg-type]
    asked = parse_chat_completion({"messages": ASK, "temperature": 0.5})
    assert session.requests == [chat_turn(asked, ServeDefaults(max_tokens=7)).request]
    assert session.requests[0].n_predict == 7 and session.requests[0].sampling.temp == 0.5
    assert [m.role for m in session.engine.history] == ["system", "user", "assistant"]
    assert (outcome.text, outcome.finish_reason, outcome.completion_tokens) == ("hello", "stop", 5)
    assert outcome.prompt_tokens == len("<s>Be brief.<u>q<a>")


def test_a_stop_string_cuts_the_reply_and_stops_the_turn() -> None:
    session = ChatSession("one\n\ntwo three")
    outcome = answer(session, ASK, {"stop": "\n\n"})  # type: ignore[arg-type]
    assert (outcome.text, outcome.finish_reason, outcome.stop_string) == ("one", "stop", "\n\n")
    assert len(session.results[-1].tokens) == len("one\n\n") and not session.results[-1].cancelled


def test_the_streamed_pieces_add_up_to_the_outcome() -> None:
    session = ChatSession("<think>plan</think>\n\nOK then")
    items = list(answer_stream(session, ASK, {}))  # type: ignore[arg-type]
    *pieces, outcome = items
    assert isinstance(outcome, Outcome) and all(isinstance(p, Delta) for p in pieces)
    assert (outcome.text, outcome.reasoning) == ("OK then", "plan")
    assert "".join(p.text for p in pieces if isinstance(p, Delta)) == "OK then"
    assert "".join(p.reasoning for p in pieces if isinstance(p, Delta)) == "plan"


def test_a_refusal_raises_before_the_stream_is_read() -> None:
    with pytest.raises(RequestError):
        answer_stream(ChatSession("hi"), ASK, {"n": 3})  # type: ignore[arg-type]


class Cancelling(ChatSession):
    """A session whose generation is cancelled at its first token."""

    def generate(self, request: Any, on_progress: Any = None, on_begin: Any = None, **kw: Any) -> Any:
        def cancel_then_report(p: Any) -> None:
            self.engine.cancel()
            if on_progress is not None:
                on_progress(p)

        return super().generate(request, cancel_then_report, on_begin, **kw)


def test_a_cancelled_chat_raises() -> None:
    with pytest.raises(DecodeAbortedError):
        answer(Cancelling("abcdef"), ASK, {})  # type: ignore[arg-type]
    with pytest.raises(DecodeAbortedError):
        list(answer_stream(Cancelling("abcdef"), ASK, {}))  # type: ignore[arg-type]
