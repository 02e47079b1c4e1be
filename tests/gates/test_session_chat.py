"""``Session.chat`` against the server and ``bmoe.Llama`` on the built-in tiny model: one
chat-completions body (tools, a response format, both), greedy, gives the same content, tool
calls and finish reason through ``Session.chat``, the server's ``/v1/chat/completions`` and
``Llama.create_chat_completion``; ``chat_stream``'s pieces add up to that reply; a field the
server answers 400 for raises the error the server's body is made from.

Each of the three runs the bodies in the same order, so each context holds what the others'
hold when a body comes (the conversation's KV prefix is kept between requests by all three).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_server import Running, direct, serving  # the in-process server of test_server.py
from test_server_agents import TOOLS  # get_weather (a bounded schema) and get_time

import bmoe
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import api_error

FLAGS = ("-c", "1024", "-t", "1", "--moe-stream", "--cache-mb", "1")
TEAM = {"type": "object", "properties": {"team": {"type": "string", "maxLength": 12}}, "required": ["team"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": TEAM}}
ASK = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
BODIES = {
    "a forced tool call": {
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 120,
    },
    "a response format": {"response_format": FORMAT, "max_tokens": 60},
    "tools beside a response format": {"tools": TOOLS, "response_format": FORMAT, "max_tokens": 60},
}
Reply = tuple[str | None, list[tuple[str, str]], str]  # content, calls (name, arguments), finish reason
Three = tuple[bmoe.Session, Running, bmoe.Llama]


@pytest.fixture(scope="module")
def three() -> Iterator[Three]:
    """A session opened as the server opens its own, the server, and ``bmoe.Llama``."""
    model = bmoe.default_model_path()
    with (
        direct(model, *FLAGS) as session,
        serving(model, *FLAGS) as running,
        bmoe.Llama(model_path=str(model), n_ctx=1024, n_threads=1, cache_mb=1, verbose=False) as llm,
    ):
        yield session, running, llm


def _message(answer: dict[str, Any]) -> Reply:
    choice = answer["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    named = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    return choice["message"]["content"], named, choice["finish_reason"]


def _outcome(o: Outcome) -> Reply:
    content = None if o.tool_calls and not o.text.strip() else o.text  # as the server writes it
    return content, [(c.name, c.arguments) for c in o.tool_calls], o.finish_reason


def _served(running: Running, fields: dict[str, Any], status: int) -> Any:
    """The server's answer to ``ASK`` with ``fields`` (its status ``status``)."""
    answer = httpx.post(f"{running.url}/chat/completions", json={"messages": ASK, **fields}, timeout=60.0)
    assert answer.status_code == status, answer.text
    return answer.json()


@pytest.mark.parametrize("case", BODIES)
def test_a_chat_is_the_servers_and_llamas_reply_to_the_same_body(three: Three, case: str) -> None:
    session, running, llm = three
    fields: dict[str, Any] = {**BODIES[case], "temperature": 0}
    got = _outcome(session.chat(ASK, **fields))
    assert got == _message(_served(running, fields, 200))
    answer = llm.create_chat_completion(messages=ASK, **fields)
    assert isinstance(answer, dict) and got == _message(answer)
    if "tool_choice" in fields:
        assert got[1] and got[1][0][0] == "get_weather" and got[2] in ("tool_calls", "length")


def test_chat_stream_s_pieces_add_up_to_chat_s_reply(three: Three) -> None:
    session, _, _ = three
    fields: dict[str, Any] = {**BODIES["a forced tool call"], "temperature": 0}
    whole = session.chat(ASK, **fields)
    *pieces, last = list(session.chat_stream(ASK, **fields))
    assert isinstance(last, Outcome) and all(isinstance(p, Delta) for p in pieces)
    deltas = [d for p in pieces if isinstance(p, Delta) for d in p.call_deltas]
    assert deltas and deltas[0].name == "get_weather"  # the call streams as it is written
    assert "".join(d.arguments for d in deltas if d.index == 0) == last.tool_calls[0].arguments
    assert _outcome(last) == _outcome(whole)
    said = session.chat(ASK, max_tokens=12, temperature=0)
    *pieces, last = list(session.chat_stream(ASK, max_tokens=12, temperature=0))
    assert "".join(p.text for p in pieces if isinstance(p, Delta)) == last.text == said.text  # type: ignore[union-attr]


REFUSED = {
    "several choices": {"n": 2},
    "a temperature out of range": {"temperature": 3},
    "an unknown response format": {"response_format": {"type": "xml"}},
    "top_logprobs without logprobs": {"top_logprobs": 2},
    "a schema format no engine enforces": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "h",
                "schema": {"type": "object", "properties": {"h": {"format": "hostname"}}},
            },
        }
    },
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_field_the_server_refuses_raises_the_error_of_its_400(three: Three, case: str) -> None:
    session, running, _ = three
    fields: dict[str, Any] = {**REFUSED[case], "max_tokens": 4}
    with pytest.raises(bmoe.ConfigError) as caught:
        session.chat(ASK, **fields)
    assert isinstance(caught.value, bmoe.BmoeError)
    assert api_error(caught.value).body() == _served(running, fields, 400)
    assert session.chat(ASK, max_tokens=2).completion_tokens == 2  # the session goes on
