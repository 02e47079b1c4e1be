"""``python -m bmoe.serve -np N``: clients served at once, as parallel sequences of one
context continuously batched, on the tiny fixture.

- Four clients streaming at once are batched together (the run's steps held several of
  their tokens): none waits for another's whole generation.
- Each answer is the one the same server gives that request alone (greedy; on this model
  llama.cpp's batched kernels round the logits differently but pick the same tokens, see
  docs/parallel.md), streamed or not, and a client that goes away mid-answer does not
  change the others'.
- Tools, JSON schemas and stop strings work per sequence; decisions still run between
  batch runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from test_server import Running, serving
from test_server_agents import ASK, TOOLS, WEATHER

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
QUESTIONS = ["Hello!", "What is the weather like?", "Tell me a story.", "Count to ten."]


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(
        tiny_model_path("qwen3moe"), "-c", "2048", "-np", "4", "--decide", "--chat-template-file", str(QWEN3)
    ) as running:
        yield running


def _ask(server: Running, question: str, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 40)
    return server.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], **kw
    )


def _streamed(server: Running, question: str, times: list[tuple[str, int, float]], **kw: Any) -> str:
    kw.setdefault("max_tokens", 40)
    text = []
    for chunk in server.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], stream=True, **kw
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            times.append((question, len(text), time.monotonic()))
            text.append(chunk.choices[0].delta.content)
    return "".join(text)


def test_four_streaming_clients_are_batched_together_and_answer_as_alone(server: Running) -> None:
    alone = {q: _ask(server, q, max_tokens=200).choices[0].message.content for q in QUESTIONS}
    server.served.session.parallel_peak = 0
    answers: dict[str, str] = {}
    go = threading.Barrier(len(QUESTIONS))

    def client(q: str) -> None:
        go.wait()
        answers[q] = _streamed(server, q, [], max_tokens=200)

    threads = [threading.Thread(target=client, args=(q,)) for q in QUESTIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == alone
    assert server.served.session.parallel_peak >= 2  # steps held several clients' tokens


def test_a_client_that_goes_away_does_not_change_the_others(server: Running) -> None:
    alone = {q: _ask(server, q).choices[0].message.content for q in QUESTIONS[:3]}
    answers: dict[str, str] = {}

    def leave() -> None:
        stream = server.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTIONS[3]}], max_tokens=40, stream=True
        )
        for n, _ in enumerate(stream):
            if n == 3:
                stream.close()  # the client goes away mid-answer
                return

    threads = [threading.Thread(target=leave)] + [
        threading.Thread(target=lambda q=q: answers.__setitem__(q, _streamed(server, q, [])))
        for q in QUESTIONS[:3]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == alone


def test_tools_schemas_and_stops_work_per_sequence_beside_each_other(server: Running) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 99}},
        "required": ["n"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    results: dict[str, Any] = {}
    work = {
        "json": lambda: _ask(server, "A number?", response_format=fmt, max_tokens=200),
        "tool": lambda: _ask(
            server,
            ASK[0]["content"],
            tools=TOOLS,
            tool_choice=named,
            parallel_tool_calls=False,
            max_tokens=200,
        ),
        "stop": lambda: _ask(server, QUESTIONS[0], stop=[" "]),
        "plain": lambda: _ask(server, QUESTIONS[1]),
    }
    threads = [threading.Thread(target=lambda k=k, f=f: results.__setitem__(k, f())) for k, f in work.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    jsonschema.validate(json.loads(results["json"].choices[0].message.content), schema)
    (call,) = results["tool"].choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert " " not in results["stop"].choices[0].message.content
    assert results["stop"].choices[0].finish_reason == "stop"
    assert (
        results["plain"].choices[0].message.content == _ask(server, QUESTIONS[1]).choices[0].message.content
    )


def test_a_decision_runs_between_batch_runs(server: Running) -> None:
    import httpx

    body = {"prefix": "Task: turn on Wi-Fi. ", "suffix": "A) Network B) Display?", "choices": ["A", "B"]}
    answer = httpx.post(f"{server.url}/decide", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["best"] in (0, 1)
    assert _ask(server, QUESTIONS[0]).choices[0].message.content  # and generation goes on


def test_a_streamed_server_batches_clients_too(tiny_model_path: TinyModelPath, server: Running) -> None:
    expected = {q: _ask(server, q).choices[0].message.content for q in QUESTIONS[:3]}
    with serving(
        tiny_model_path("qwen3moe"),
        *("-c", "2048", "-np", "3", "--moe-stream", "--cache-mb", "1", "--chat-template-file", str(QWEN3)),
    ) as streamed:
        assert streamed.served.session.streaming is not None
        answers: dict[str, str] = {}
        go = threading.Barrier(3)

        def client(q: str) -> None:
            go.wait()
            answers[q] = _streamed(streamed, q, [])

        threads = [threading.Thread(target=client, args=(q,)) for q in QUESTIONS[:3]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert streamed.served.session.streaming.counters().misses > 0
    assert answers == expected


def test_the_metrics_feed_says_the_slots(server: Running) -> None:
    assert server.served.slots() == (4, 0, 0)  # idle between runs
    seen: list[tuple[int, int, int]] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.append(server.served.slots())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = [threading.Thread(target=_ask, args=(server, q), kwargs={"max_tokens": 200}) for q in QUESTIONS]
    for t in clients:
        t.start()
    for t in clients:
        t.join(120)
    watching.set()
    watcher.join()
    assert max(busy for _, busy, _ in seen) >= 2 and all(total == 4 for total, _, _ in seen)


def test_a_conversation_comes_back_to_its_slot_and_slots_say_what_they_keep(server: Running) -> None:
    """-np keeps each slot's KV: the second turn of a conversation reuses its first (the
    usage's cached tokens), and ``GET /slots`` says what each slot keeps between runs."""
    messages: list[Any] = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Hi"},
    ]
    first = server.client().chat.completions.create(model="m", messages=messages, max_tokens=8)
    assert first.usage is not None
    slots = httpx.get(f"{server.url.removesuffix('/v1')}/slots").json()
    assert len(slots) == 4 and max(s["tokens_cached"] for s in slots) > 0
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "More"},
    ]
    second = server.client().chat.completions.create(model="m", messages=messages, max_tokens=8)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens // 2
