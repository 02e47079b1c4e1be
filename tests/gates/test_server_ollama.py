"""Ollama's API on ``bmoe.serve``, driven by the real clients: the ``ollama`` Python client
(chat, generate, streaming, images, tools, ``format`` with a pydantic model's schema, list,
show, ps, errors) and ``langchain-ollama``'s ``ChatOllama`` (``invoke``, ``bind_tools``,
``with_structured_output``). Every greedy answer is the chat completions route's answer to
the same messages and sampling; streamed (``--moe-stream --cache-mb 1``) equals resident."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pydantic
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_ollama import ChatOllama
from test_image_gates import PICTURE_A
from test_server import Running, serving  # the in-process server of test_server.py

from bmoe.adapters.llama import vision as vision_adapter
from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING
from bmoe.testing.fixtures.vision import vision_fixture

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
FLAGS = ("-c", "1024", "--chat-template-file", str(QWEN3), "--alias", "tiny")
N = 12
GREEDY = {"temperature": 0, "num_predict": N}
SYSTEM = "Answer briefly."
ASK = "What is the weather in Oslo?"
MESSAGES: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
WEATHER_TOOL: Any = {  # what the ollama client makes of get_weather below
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {  # in the order the client's model writes its keys, which the template keeps
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"type": "string", "description": "The city's name."}},
        },
    },
}
HISTORY: Any = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
    },
    {"role": "tool", "content": "rain, 9 C", "tool_name": "get_weather"},
]
OPENAI_HISTORY: Any = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "rain, 9 C"},
]


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)  # a random model's string ends within the reply
    rain: bool


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return "rain"


def root(running: Running) -> str:
    return running.url.removesuffix("/v1")


def client_of(running: Running, **kw: Any) -> ollama.Client:
    return ollama.Client(host=root(running), timeout=60, **kw)


def completion(running: Running, messages: Any, **fields: Any) -> Any:
    """The chat completions route's greedy answer: its message and its usage."""
    body = {"model": "tiny", "messages": messages, "max_tokens": N, "temperature": 0, **fields}
    answer = httpx.post(f"{running.url}/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"], answer.json()["usage"]


def streamed_chat(client: ollama.Client, **kw: Any) -> tuple[str, list[ollama.ChatResponse]]:
    parts = list(client.chat(model="tiny", stream=True, **kw))
    return "".join(p.message.content or "" for p in parts), parts


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), *FLAGS) as running:
        yield running


@pytest.fixture(scope="module")
def streamed(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), *FLAGS, "--moe-stream", "--cache-mb", "1") as running:
        yield running


def test_chat_and_generate_whole_or_streamed_are_the_chat_completions_answer(server: Running) -> None:
    client = client_of(server)
    ref, usage = completion(server, MESSAGES)
    whole = client.chat(model="tiny", messages=MESSAGES, options=GREEDY, stream=False)
    text, parts = streamed_chat(client, messages=MESSAGES, options=GREEDY)
    generated = client.generate(model="tiny:latest", system=SYSTEM, prompt=ASK, options=GREEDY)
    pieces = list(client.generate(model="tiny", system=SYSTEM, prompt=ASK, options=GREEDY, stream=True))
    assert whole.message.content == ref["content"] == text == generated.response
    assert "".join(p.response or "" for p in pieces) == ref["content"]
    assert (whole.done, whole.done_reason) == (True, "length")
    assert (whole.eval_count, whole.prompt_eval_count) == (usage["completion_tokens"], usage["prompt_tokens"])
    for timed in (whole, parts[-1], generated, pieces[-1]):
        assert timed.total_duration and timed.eval_duration and timed.prompt_eval_duration is not None
        assert timed.total_duration >= timed.eval_duration
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == N
    raw = client.generate(model="tiny", prompt="Once upon a time", raw=True, options=GREEDY)
    text_ref = httpx.post(
        f"{server.url}/completions",
        json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": N, "temperature": 0},
        timeout=60,
    ).json()["choices"][0]["text"]
    assert raw.response == text_ref


def test_options_and_a_stop_string_answer_as_chat_completions(server: Running) -> None:
    client = client_of(server)
    ref, _ = completion(server, MESSAGES)
    stop = ref["content"][3:6]
    cut, _ = completion(server, MESSAGES, stop=[stop])
    stopped = client.chat(model="tiny", messages=MESSAGES, options={**GREEDY, "stop": [stop]})
    assert stopped.message.content == cut["content"] == ref["content"][: ref["content"].index(stop)]
    assert stopped.done_reason == "stop"
    sampled = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7, "num_predict": N}
    hot, _ = completion(server, MESSAGES, temperature=0.9, top_k=20, top_p=0.9, seed=7)
    assert client.chat(model="tiny", messages=MESSAGES, options=sampled).message.content == hot["content"]
    ignored = {**GREEDY, "num_ctx": 32768, "num_gpu": 99, "mirostat": 0, "keep": 1}
    assert (
        client.chat(model="tiny", messages=MESSAGES, options=ignored, keep_alive="5m").message.content
        == (ref["content"])
    )


def test_tools_and_a_tool_loop_answer_as_chat_completions(server: Running) -> None:
    client = client_of(server)
    ref, _ = completion(server, MESSAGES, tools=[WEATHER_TOOL])
    asked = client.chat(model="tiny", messages=MESSAGES, tools=[get_weather], options=GREEDY)
    as_dict = client.chat(model="tiny", messages=MESSAGES, tools=[WEATHER_TOOL], options=GREEDY)
    assert asked.message.content == as_dict.message.content == (ref["content"] or "")
    calls = [(c.function.name, dict(c.function.arguments)) for c in asked.message.tool_calls or []]
    assert calls == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ref.get("tool_calls") or []
    ]
    after, _ = completion(server, OPENAI_HISTORY, tools=[WEATHER_TOOL])
    answered = client.chat(model="tiny", messages=HISTORY, tools=[get_weather], options=GREEDY)
    assert answered.message.content == (after["content"] or "")


def test_format_takes_json_or_a_pydantic_models_schema(server: Running) -> None:
    client = client_of(server)
    schema = Weather.model_json_schema()
    ref, _ = completion(
        server,
        MESSAGES,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    shaped = client.chat(
        model="tiny", messages=MESSAGES, format=schema, options={**GREEDY, "num_predict": 64}
    )
    assert shaped.message.content == ref["content"]
    assert Weather.model_validate_json(shaped.message.content or "")
    as_json, _ = completion(server, MESSAGES, max_tokens=64, response_format={"type": "json_object"})
    loose = client.chat(model="tiny", messages=MESSAGES, format="json", options={**GREEDY, "num_predict": 64})
    assert loose.message.content == as_json["content"]
    assert (loose.message.content or "").startswith("{")  # an object, cut where num_predict ends it


def test_list_show_ps_version_probes_and_errors_in_ollamas_shape(server: Running) -> None:
    client = client_of(server)
    (listed,) = client.list().models
    assert listed.model == "tiny:latest" and listed.details is not None
    assert listed.details.family == "qwen3moe" and listed.details.format == "gguf"
    shown = client.show("tiny:latest")
    assert shown.capabilities is not None and {"completion", "tools", "thinking"} <= set(shown.capabilities)
    assert shown.template is not None and "<|im_start|>" in shown.template
    assert shown.modelinfo is not None and shown.modelinfo["qwen3moe.context_length"] == 1024
    (running,) = client.ps().models
    assert running.model == "tiny:latest" and running.context_length == 1024
    assert httpx.get(f"{root(server)}/api/version").json()["version"]
    assert client.chat(model="tiny", messages=[]).done_reason == "load"
    assert client.generate(model="tiny", keep_alive=0).done_reason == "unload"
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3.2", messages=MESSAGES)
    assert (missing.value.status_code, missing.value.error) == (404, "model 'llama3.2' not found")
    with pytest.raises(ollama.ResponseError) as shown_missing:
        client.show("llama3.2")
    assert shown_missing.value.status_code == 404
    for call in (
        lambda: client.pull("tiny"),
        lambda: client.embed(model="tiny", input="x"),
        lambda: client.delete("tiny"),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 501 and "is not served" in refused.value.error
    bad = httpx.post(
        f"{root(server)}/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": 3}]}
    )
    assert bad.status_code == 400 and "messages[0].content" in bad.json()["error"]
    assert httpx.get(f"{root(server)}/api/nothing").json()["error"].endswith("404 page not found")
    ref, _ = completion(server, MESSAGES)
    assert client.chat(model="tiny", messages=MESSAGES, options=GREEDY).message.content == ref["content"]


def test_the_api_key_guards_ollamas_routes(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe"), *FLAGS, "--api-key", "k-1") as s:
        with pytest.raises(ollama.ResponseError) as refused:
            client_of(s).list()
        assert refused.value.status_code == 401 and "API key" in refused.value.error
        keyed = client_of(s, headers={"Authorization": "Bearer k-1"})
        assert keyed.list().models[0].model == "tiny:latest"
        assert keyed.chat(model="tiny", messages=MESSAGES, options=GREEDY).done
        assert httpx.head(f"{root(s)}/").status_code == 200  # the heartbeat Ollama's CLI sends


def test_chat_ollama_invokes_binds_tools_and_structures_output(server: Running) -> None:
    llm = ChatOllama(model="tiny", base_url=root(server), temperature=0, num_predict=N)
    messages = [SystemMessage(SYSTEM), HumanMessage(ASK)]
    ref, _ = completion(server, MESSAGES)
    assert llm.invoke(messages).content == ref["content"]
    assert "".join(str(chunk.content) for chunk in llm.stream(messages)) == ref["content"]
    tooled, _ = completion(server, MESSAGES, tools=[WEATHER_TOOL])
    reply = llm.bind_tools([WEATHER_TOOL]).invoke(messages)
    assert reply.content == (tooled["content"] or "")
    assert [c["name"] for c in reply.tool_calls] == [
        c["function"]["name"] for c in tooled.get("tool_calls") or []
    ]
    schema = Weather.model_json_schema()
    shaped, _ = completion(
        server,
        MESSAGES,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    structured = ChatOllama(model="tiny", base_url=root(server), temperature=0, num_predict=64)
    assert structured.with_structured_output(Weather).invoke(messages) == Weather.model_validate_json(
        shaped["content"]
    )


def test_streamed_experts_answer_as_resident_through_ollamas_routes(
    server: Running, streamed: Running
) -> None:
    answers = []
    for running in (server, streamed):
        client = client_of(running)
        text, _ = streamed_chat(client, messages=MESSAGES, options=GREEDY)
        tools = client.chat(model="tiny", messages=HISTORY, tools=[get_weather], options=GREEDY)
        generated = client.generate(model="tiny", prompt=ASK, options=GREEDY)
        answers.append((text, tools.message.content, generated.response))
    assert answers[0] == answers[1]
    assert all(answers[0])


def test_thinking_comes_as_thinking_and_can_be_switched_off(tiny_model_path: TinyModelPath) -> None:
    ask: Any = [{"role": "user", "content": "Should I bring an umbrella?"}]
    with serving(tiny_model_path("qwen3moe-think"), "--alias", "t") as s:
        client = client_of(s)
        thought = client.chat(model="t", messages=ask, think=True, options={"num_predict": 32})
        parts = list(
            client.chat(model="t", messages=ask, think=True, options={"num_predict": 32}, stream=True)
        )
        off = client.chat(model="t", messages=ask, think=False, options={"num_predict": 32})
        generated = client.generate(
            model="t", prompt=ask[0]["content"], think=True, options={"num_predict": 32}
        )
    assert thought.message.thinking == f"\n{THINK_REASONING}\n" and thought.message.content == THINK_ANSWER
    assert thought.done_reason == "stop"
    assert "".join(p.message.thinking or "" for p in parts) == thought.message.thinking
    assert "".join(p.message.content or "" for p in parts) == THINK_ANSWER
    assert off.message.thinking is None and off.message.content == THINK_ANSWER
    assert (generated.thinking, generated.response) == (thought.message.thinking, THINK_ANSWER)


@pytest.mark.skipif(not vision_adapter.available(), reason="llama-cpp-python built without libmtmd")
def test_images_as_base64_answer_as_chat_completions_image_url() -> None:
    fx = vision_fixture("qwen3vl")
    question = "What is in this picture?"
    flags = ("--mmproj", str(fx.mmproj), *FLAGS, "--no-think")
    with serving(fx.model, *flags) as s:
        uri = "data:image/png;base64," + base64.b64encode(PICTURE_A).decode()
        parts = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": question}]
        ref, _ = completion(s, [{"role": "user", "content": parts}])
        client = client_of(s)
        seen = client.chat(
            model="tiny",
            messages=[{"role": "user", "content": question, "images": [PICTURE_A]}],
            options=GREEDY,
        )
        generated = client.generate(model="tiny", prompt=question, images=[PICTURE_A], options=GREEDY)
        without = client.chat(model="tiny", messages=[{"role": "user", "content": question}], options=GREEDY)
        broken = httpx.post(
            f"{root(s)}/api/chat",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "x", "images": ["bm90IGEgcGljdHVyZQ=="]}],
            },
            timeout=60,
        )
        assert "vision" in (client.show("tiny").capabilities or [])
    assert seen.message.content == ref["content"] == generated.response
    assert without.message.content != seen.message.content
    assert broken.status_code == 400 and "messages[0].images[0]" in broken.json()["error"]
