"""Mutated bodies on the chat completions, Responses, Messages and Ollama routes: each answer
is a success or a 4xx in the route's error shape, never a 5xx for a bad body, never a hang. One
body in five has a pathological schema (``test_dead_end_schemas.PATHOLOGICAL``: a schema
that is itself, a required recursion, an empty enum, contradictions...) where the route
takes one (a response format, a tool's parameters). After every body a valid greedy request
is answered with the tokens it gave before the storm, and at the end the route's own valid
request gets the same answer as before. One body in fifty holds ``1e999`` (infinity to
Python's JSON reader, which JSON cannot write back) at a random place, the first of them in
``metadata`` (issue 64: Responses once answered that with a 500). ``BMOE_FUZZ_EXAMPLES``
sets the bodies per route."""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_dead_end_schemas import PATHOLOGICAL, greedy
from test_server import serving  # the in-process server of test_server.py

TinyModelPath = Callable[..., Path]
MUTANTS = int(os.environ.get("BMOE_FUZZ_EXAMPLES", "400"))
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSES = {
    "model": "t",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    ],
    "tools": [{"type": "function", "name": "get_weather", "parameters": TOOL_SCHEMA}],
    "tool_choice": "auto",
    "max_output_tokens": 3,
    "temperature": 0.0,
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}},
}
MESSAGES = {
    "model": "t",
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}]},
    ],
    "tools": [{"name": "get_weather", "input_schema": TOOL_SCHEMA}],
    "tool_choice": {"type": "auto"},
    "max_tokens": 3,
    "stop_sequences": ["\n\n"],
}
CHAT = {
    "model": "t",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_SCHEMA}}],
    "tool_choice": "auto",
    "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": TOOL_SCHEMA}},
    "max_tokens": 3,
    "temperature": 0.0,
}

OLLAMA_OPTIONS = {"temperature": 0, "num_predict": 3, "stop": ["\n\n"], "top_k": 40, "repeat_penalty": 1.1}
OLLAMA_CHAT = {  # "model": the served model's name, set when the server is up
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "rain", "tool_name": "get_weather"},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_SCHEMA}}],
    "format": TOOL_SCHEMA,
    "options": OLLAMA_OPTIONS,
    "think": False,
    "keep_alive": "5m",
    "stream": False,
}
OLLAMA_GENERATE = {
    "prompt": "Weather?",
    "system": "Be brief.",
    "format": "json",
    "options": OLLAMA_OPTIONS,
    "keep_alive": 0,
    "stream": False,
}
UNTIMED = ("created_at", "total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


def _set(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = body
    for step in path[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(step), dict | list):
            node[step] = {}
        node = node[step]
    node[path[-1]] = value


# where each route takes a schema: the paths a pathological one goes to (after the format is
# made a json_schema one where the path is a format's)
SCHEMA_SLOTS: dict[str, list[tuple[tuple[Any, ...], dict[tuple[Any, ...], Any]]]] = {
    "chat": [
        (("response_format", "json_schema", "schema"), {("response_format", "type"): "json_schema"}),
        (("tools", 0, "function", "parameters"), {}),
    ],
    "responses": [
        (
            ("text", "format", "schema"),
            {("text", "format", "type"): "json_schema", ("text", "format", "name"): "r"},
        ),
        (("tools", 0, "parameters"), {}),
    ],
    "messages": [(("tools", 0, "input_schema"), {})],
    "ollama_chat": [(("format",), {}), (("tools", 0, "function", "parameters"), {})],
    "ollama_generate": [(("format",), {})],
}


def pathological(body: dict[str, Any], kind: str, rng: random.Random) -> dict[str, Any]:
    """``body`` with one pathological schema where ``kind``'s route takes a schema."""
    out = copy.deepcopy(body)
    path, beside = rng.choice(SCHEMA_SLOTS[kind])
    for at, value in beside.items():
        _set(out, at, value)
    _set(out, path, copy.deepcopy(rng.choice(list(PATHOLOGICAL.values()))))
    return out


JUNK: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    1.5e308,
    "",
    "x",
    "é" * 3,
    [],
    {},
    [None],
    {"type": None},
    "a" * 5000,
]


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*at, i))
    return found


def mutate(body: dict[str, Any], rng: random.Random) -> Any:
    """``body`` with one to three random changes: a node replaced by junk or another node,
    a key dropped or added, a list emptied or doubled; now and then not JSON at all."""
    out = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(out) if p]
        if not paths or not isinstance(out, dict):
            break
        path = rng.choice(paths)
        parent: Any = out
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        roll = rng.random()
        if roll < 0.45:
            parent[last] = copy.deepcopy(rng.choice(JUNK))
        elif roll < 0.6 and isinstance(parent, dict):
            del parent[last]
        elif roll < 0.7 and isinstance(parent, dict):
            parent[rng.choice(["type", "role", "content", "zzz", "stream", "name"])] = rng.choice(JUNK)
        elif roll < 0.8:
            parent[last] = copy.deepcopy(out.get(rng.choice(list(out)))) if out else None
        elif roll < 0.9 and isinstance(parent[last], list):
            parent[last] = parent[last] * 2 if rng.random() < 0.5 else []
        else:
            parent[last] = rng.choice(["text", "function", "message", "tool_use", "any", "json_schema"])
    return out


INFINITE = "\0infinite\0"  # where infinite() writes 1e999


def infinite(body: dict[str, Any], rng: random.Random, at: tuple[Any, ...] | None = None) -> bytes:
    """``body`` as JSON text with ``1e999`` at ``at``, else at a random node."""
    out = copy.deepcopy(body)
    _set(out, at or rng.choice([p for p in _paths(out) if p]), INFINITE)
    return json.dumps(out).replace(json.dumps(INFINITE), "1e999").encode()


def _shape_ok(route: str, body: Any) -> bool:
    if route.startswith("/api/"):
        return isinstance(body.get("error"), str)
    if route.startswith("/v1/messages"):
        return body.get("type") == "error" and isinstance(body.get("error", {}).get("message"), str)
    error = body.get("error")
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


@pytest.mark.parametrize(
    ("route", "base"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/responses", RESPONSES),
        ("/v1/responses/input_tokens", RESPONSES),
        ("/v1/messages", MESSAGES),
        ("/v1/messages/count_tokens", MESSAGES),
        ("/api/chat", OLLAMA_CHAT),
        ("/api/generate", OLLAMA_GENERATE),
    ],
)
def test_mutated_bodies_get_a_4xx_in_the_routes_shape_or_an_answer_and_never_end_the_session(
    tiny_model_path: TinyModelPath, route: str, base: dict[str, Any]
) -> None:
    rng = random.Random(route)
    kind = f"ollama_{route.split('/')[2]}" if route.startswith("/api/") else route.split("/")[2]
    with (
        serving(tiny_model_path("qwen3moe"), "-c", "512", "--max-tokens", "3") as s,
        httpx.Client(timeout=30.0) as http,
    ):
        root = s.url.removesuffix("/v1")
        url = root + route
        if route.startswith("/api/"):  # Ollama's routes answer the served model's name only
            base = {"model": s.served.model_id, **base}
        before = http.post(url, json=base)
        assert before.status_code == 200, before.text
        tokens = greedy(http, root)
        statuses: dict[int, int] = {}
        for n in range(MUTANTS):
            body: Any = None
            if n % 50 == 0:
                answer = http.post(
                    url, content=b'{"model": "t", "input": [', headers={"content-type": "application/json"}
                )
            elif n % 50 == 25:
                body = infinite(base, rng, ("metadata", "a") if n == 25 else None)
                answer = http.post(url, content=body, headers={"content-type": "application/json"})
            else:
                body = pathological(base, kind, rng) if rng.random() < 0.2 else mutate(base, rng)
                body["stream"] = rng.random() < 0.1  # a stream's answer is read whole; its status counts
                answer = http.post(url, json=body)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert answer.status_code < 500, (body, answer.text)
            if answer.status_code >= 400:
                assert _shape_ok(route, answer.json()), answer.text
            assert greedy(http, root) == tokens, body  # the session lives on, unchanged
        assert http.get(f"{root}/health").status_code == 200
        after = http.post(url, json=base)
    assert statuses.get(400, 0) > MUTANTS // 4  # the storm was mostly bad bodies
    strip = ("id", "created", "system_fingerprint", *UNTIMED)
    first, last = before.json(), after.json()
    for key in strip:
        first.pop(key, None)
        last.pop(key, None)
    if "output" in first:  # item ids are fresh in each response
        for item in (*first["output"], *last["output"]):
            item.pop("id", None)
    used = [_prompt_tokens(body.pop("usage", None)) for body in (first, last)]
    assert first == last and used[0] == used[1]  # the same answer from the same prompt (KV reuse aside)


def _prompt_tokens(usage: Any) -> int | None:
    if usage is None:
        return None
    if "prompt_tokens" in usage:  # chat completions: the prompt, cached tokens counted in it
        return int(usage["prompt_tokens"])
    return int(usage["input_tokens"] + usage.get("cache_read_input_tokens", 0))
