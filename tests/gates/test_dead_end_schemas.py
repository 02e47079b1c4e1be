"""A schema that dead-ends is its request's error, never the server's: on every route that
takes a schema or tools, each pathological schema is answered with the route's 400 (a short
message about the schema, never the constraint engine's state) or an answer, ``/health``
stays 200, and the greedy request after it gives the tokens a fresh server gives.

``--no-precheck`` cases: the same schemas with the check before the prefill out of the way
(``schema_dead_ends``), so that the dead end is met while generating, as one the check
cannot see would be; the request still ends alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server import Running, serving

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
SELF = {"$ref": "#"}
REQUIRED_CHILD = {
    "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
    "$ref": "#/$defs/n",
}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


PATHOLOGICAL: dict[str, Any] = {
    "self reference": SELF,
    "required recursion": REQUIRED_CHILD,
    "required item recursion": {
        "type": "object",
        "properties": {"k": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
        "required": ["k"],
    },
    "reference cycle": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    },
    "not": {"not": {}},
    "empty enum": {"enum": []},
    "no type": {"type": []},
    "minimum above maximum": {"type": "integer", "minimum": 5, "maximum": 1},
    "minLength above maxLength": {"type": "string", "minLength": 5, "maxLength": 1},
    "contradictory allOf": {"allOf": [{"type": "string"}, {"type": "integer"}]},
    "required property that cannot exist": {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["b"],
        "additionalProperties": False,
    },
    "huge minItems": {"type": "array", "items": {"type": "integer"}, "minItems": 100000},
    "pattern no string matches": {"type": "string", "pattern": "^[a]{3}[^\\s\\S]$"},
    "deep nesting": _nested(8),
}
DUMP = ("Tokens:", "grm_prefix", "Parser:", "compute_time_us", "NoExtensionBias", "<state>")
GREEDY = [{"role": "user", "content": "Hi"}]


def _chat_format(schema: Any) -> dict[str, Any]:
    return {
        "messages": GREEDY,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    }


def _chat_tools(schema: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {"messages": GREEDY, "tools": [tool], "tool_choice": "required"}


def _responses_format(schema: Any) -> dict[str, Any]:
    return {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}}}


def _responses_tools(schema: Any) -> dict[str, Any]:
    return {
        "input": "Hi",
        "tools": [{"type": "function", "name": "f", "parameters": schema}],
        "tool_choice": "required",
    }


def _messages_tools(schema: Any) -> dict[str, Any]:
    return {
        "messages": GREEDY,
        "tools": [{"name": "f", "input_schema": schema}],
        "tool_choice": {"type": "any"},
    }


def _ollama_format(schema: Any) -> dict[str, Any]:
    return {"messages": GREEDY, "format": schema, "options": {"temperature": 0, "num_predict": 24}}


ROUTES: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "chat response_format": ("/v1/chat/completions", _chat_format),
    "chat tools": ("/v1/chat/completions", _chat_tools),
    "responses text.format": ("/v1/responses", _responses_format),
    "responses tools": ("/v1/responses", _responses_tools),
    "messages tools": ("/v1/messages", _messages_tools),
    "ollama format": ("/api/chat", _ollama_format),
}


def greedy(http: httpx.Client, base: str) -> list[str]:
    """The tokens of a greedy chat answer (their text, from the log-probabilities)."""
    body = {"model": "m", "messages": GREEDY, "temperature": 0.0, "max_tokens": 12, "logprobs": True}
    answer = http.post(f"{base}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return [t["token"] for t in answer.json()["choices"][0]["logprobs"]["content"]]


def _error_ok(route: str, answer: httpx.Response) -> str:
    """The error's message, after checking the route's shape and that it says no more than it should."""
    body = answer.json()
    if route.startswith("/api/"):  # Ollama's shape: {"error": "..."}
        message = body["error"]
        assert isinstance(message, str), body
    elif route == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error", body
        message = body["error"]["message"]
    assert len(message) < 400 and not any(word in message for word in DUMP), message
    return str(message)


@pytest.fixture(scope="module")
def fresh_tokens(tiny_model_path: TinyModelPath) -> list[str]:
    """What a fresh server answers the greedy request with."""
    with serving(tiny_model_path("qwen3moe"), *FLAGS) as running, httpx.Client(timeout=60.0) as http:
        return greedy(http, running.url.removesuffix("/v1"))


FLAGS = ("-c", "1024", "--chat-template-file", str(QWEN3), "--max-tokens", "24", "--alias", "m")


@pytest.fixture(scope="module", params=["-np 1", "-np 2"])
def server(request: pytest.FixtureRequest, tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), *FLAGS, *str(request.param).split()) as running:
        yield running


def _storm(server: Running, fresh: list[str], route_name: str) -> dict[str, tuple[int, int]]:
    """Each pathological schema on ``route_name``, then the greedy request: their statuses."""
    route, body_of = ROUTES[route_name]
    base = server.url.removesuffix("/v1")
    seen: dict[str, tuple[int, int]] = {}
    with httpx.Client(timeout=60.0) as http:
        for name, schema in PATHOLOGICAL.items():
            for stream in (False, True):
                body = {
                    "model": "m",
                    "temperature": 0.0,
                    "max_tokens": 24,
                    **body_of(schema),
                    "stream": stream,
                }
                answer = http.post(base + route, json=body)
                assert answer.status_code in (200, 400), (name, answer.text)
                if answer.status_code == 400:
                    _error_ok(route, answer)
                elif stream:
                    _stream_error_ok(route, answer.text)
                assert http.get(f"{base}/health").status_code == 200, (name, route_name)
                assert greedy(http, base) == fresh, (name, route_name, stream)
                seen[f"{name}{' (stream)' if stream else ''}"] = (answer.status_code, 200)
    return seen


def _stream_error_ok(route: str, text: str) -> None:
    """A stream that ended with the route's error event says only a short message."""
    for line in text.splitlines():
        if route.startswith("/api/"):  # Ollama's: one JSON object a line, an error {"error": "..."}
            event = json.loads(line)
            error = {"message": event["error"]} if "error" in event else None
        elif not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        else:
            event = json.loads(line.removeprefix("data:").strip())
            error = event.get("error") if isinstance(event, dict) else None
        if isinstance(error, dict):
            message = error.get("message", "")
            assert len(message) < 400 and not any(word in message for word in DUMP), message


@pytest.mark.parametrize("route_name", sorted(ROUTES))
def test_each_pathological_schema_ends_its_request_only(
    server: Running, fresh_tokens: list[str], route_name: str
) -> None:
    seen = _storm(server, fresh_tokens, route_name)
    print(route_name, json.dumps(seen))
    for name in ("self reference", "required recursion", "required item recursion", "reference cycle"):
        assert seen[name][0] == 400, (route_name, name)


def test_the_refusal_names_the_schema_in_a_few_words(server: Running) -> None:
    base = server.url.removesuffix("/v1")
    with httpx.Client(timeout=60.0) as http:
        body = {"model": "m", "max_tokens": 8, **_chat_format(SELF)}
        answer = http.post(f"{base}/v1/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert error["message"] == (
        "the schema at response_format.json_schema.schema allows no value (a reference to itself)"
    )
