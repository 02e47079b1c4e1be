"""Images through the server (issue 55) on the M-RoPE vision fixture: the same picture sent as
chat completions' ``image_url``, a Messages ``image`` block (Claude Code's shape) and a
Responses ``input_image`` (Codex's) gives one answer, that of the session itself; a picture
that does not decode, a remote URL with fetching off and an image to a model without a
vision encoder are each refused (400) by name, and the server goes on answering."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from test_image_gates import PICTURE_A, PICTURE_B
from test_server import Running, direct, serving  # the in-process server of test_server.py

from bmoe.adapters.llama import vision as vision_adapter
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import MEDIA_MARKER, Image
from bmoe.testing.fixtures.vision import vision_fixture

pytestmark = pytest.mark.skipif(
    not vision_adapter.available(), reason="llama-cpp-python built without libmtmd"
)

QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
FLAGS = ("-c", "1024", "--chat-template-file", str(QWEN3), "--no-think")
N = 10
QUESTION = "What is in this picture?"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{b64(data)}"


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    fx = vision_fixture("qwen3vl")
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS) as running:
        yield running


def chat_body(picture: bytes, url: str | None = None) -> dict[str, Any]:
    parts = [
        {"type": "image_url", "image_url": {"url": url or data_uri(picture)}},
        {"type": "text", "text": QUESTION},
    ]
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": N,
        "temperature": 0,
    }


def post(running: Running, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(running.url.removesuffix("/v1") + path, json=body, timeout=60)


def answer(running: Running, body: dict[str, Any]) -> str:
    """A chat completion's text."""
    return str(post(running, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"])


def test_one_picture_through_the_three_apis_is_one_answer_the_sessions(server: Running) -> None:
    chat = server.client().chat.completions.create(**chat_body(PICTURE_A))
    claude = anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="unused", max_retries=0)
    image_block: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(PICTURE_A)},
    }
    message = claude.messages.create(
        model="tiny",
        max_tokens=N,
        messages=[{"role": "user", "content": [image_block, {"type": "text", "text": QUESTION}]}],
    )
    response = server.client().responses.create(
        model="tiny",
        max_output_tokens=N,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_uri(PICTURE_A), "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
    )
    other = server.client().chat.completions.create(**chat_body(PICTURE_B))
    fx = vision_fixture("qwen3vl")
    with direct(fx.model, "--mmproj", str(fx.mmproj), *FLAGS) as session:
        ref = session.generate(
            GenerateRequest(
                f"{MEDIA_MARKER}\n{QUESTION}", n_predict=N, think=False, images=(Image(PICTURE_A),)
            ),
            history=[],
        )
    text = chat.choices[0].message.content
    assert text == ref.text and chat.usage is not None and chat.usage.completion_tokens == N
    assert message.content[0].text == text  # type: ignore[union-attr]
    assert response.output_text == text
    assert other.choices[0].message.content != text


def test_what_cannot_be_seen_is_a_400_by_name_and_the_server_goes_on(server: Running) -> None:
    first = post(server, "/v1/chat/completions", chat_body(PICTURE_A)).json()["choices"][0]["message"]
    broken = post(server, "/v1/chat/completions", chat_body(b"not a picture"))
    assert broken.status_code == 400, broken.text
    assert "messages[0].content[0]" in broken.json()["error"]["message"]
    assert "not a picture" in broken.json()["error"]["message"]
    remote = post(server, "/v1/chat/completions", chat_body(b"", url="https://example.com/cat.png"))
    assert remote.status_code == 400, remote.text
    assert "--allow-remote-media" in remote.json()["error"]["message"]
    claude_broken = post(
        server,
        "/v1/messages",
        {
            "model": "tiny",
            "max_tokens": N,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": b64(b"GIF89a junk"),
                            },
                        }
                    ],
                }
            ],
        },
    )
    assert claude_broken.status_code == 400, claude_broken.text
    assert httpx.get(server.url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
    again = post(server, "/v1/chat/completions", chat_body(PICTURE_A)).json()["choices"][0]["message"]
    assert again == first


def test_a_model_without_a_vision_encoder_refuses_an_image_by_name() -> None:
    fx = vision_fixture("qwen3vl")
    with serving(fx.model, *FLAGS) as running:
        refused = post(running, "/v1/chat/completions", chat_body(PICTURE_A))
        assert refused.status_code == 400, refused.text
        assert "without a vision encoder" in refused.json()["error"]["message"]
        assert "--mmproj" in refused.json()["error"]["message"]
        text = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
        assert post(running, "/v1/chat/completions", text).status_code == 200


def test_history_images_stay_in_the_conversation(server: Running) -> None:
    """A second turn sent with the first turn's image in its history: 200, the image part
    of the prompt (its rows reused from the KV)."""
    first = chat_body(PICTURE_A)
    reply = post(server, "/v1/chat/completions", first).json()["choices"][0]["message"]
    follow = dict(first)
    follow["messages"] = [
        *first["messages"],
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": "And the colours?"},
    ]
    answered = post(server, "/v1/chat/completions", follow)
    assert answered.status_code == 200, answered.text
    usage = answered.json()["usage"]
    assert usage["prompt_tokens"] > 16  # the picture's rows are in the prompt
    _ = ChatMessage  # the shape the server reads history into


def test_session_chat_and_llama_take_image_url_parts_as_the_server_does(server: Running) -> None:
    """``Session.chat`` and ``bmoe.Llama.create_chat_completion`` (mmproj=, or
    llama-cpp-python's ``chat_handler`` with its ``clip_model_path``) read the same body."""
    import types

    import bmoe

    body = chat_body(PICTURE_A)
    served = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    fx = vision_fixture("qwen3vl")
    with direct(fx.model, "--mmproj", str(fx.mmproj), *FLAGS) as session:
        outcome = session.chat(body["messages"], max_tokens=N, temperature=0)
    assert outcome.text == served
    with direct(fx.model, "--mmproj", str(fx.mmproj), "-c", "1024", "-b", "512") as session:
        own_template = session.chat(body["messages"], max_tokens=N, temperature=0)  # Llama's template
    handler = types.SimpleNamespace(clip_model_path=str(fx.mmproj))
    llama = bmoe.Llama(
        str(fx.model), n_ctx=1024, n_batch=512, moe_stream=False, verbose=False, chat_handler=handler
    )
    try:
        reply = llama.create_chat_completion(body["messages"], max_tokens=N, temperature=0)
    finally:
        llama.close()
    assert isinstance(reply, dict)
    assert reply["choices"][0]["message"]["content"] == own_template.text


def test_parallel_slots_answer_images_as_one_slot_does(server: Running) -> None:
    """``-np 2`` (prompts joining in chunks beside running ones; a prompt with an image is
    prefilled alone): two pictures and a text request at once, each answered as the
    one-slot server answers it."""
    from concurrent.futures import ThreadPoolExecutor

    text = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": N}
    bodies = [chat_body(PICTURE_A), chat_body(PICTURE_B), text]
    single = [
        post(server, "/v1/chat/completions", b).json()["choices"][0]["message"]["content"] for b in bodies
    ]
    fx = vision_fixture("qwen3vl")
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS, "-np", "2") as parallel:
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda b: post(parallel, "/v1/chat/completions", b), bodies))
        assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
        assert [a.json()["choices"][0]["message"]["content"] for a in answers] == single
        assert answer(parallel, bodies[0]) == single[0]  # from a slot that kept the image's KV


def test_v1_decide_takes_images() -> None:
    """``/v1/decide``'s ``images`` (data: URIs or base64, one a marker): the session's scores."""
    fx = vision_fixture("qwen3vl")
    body = {
        "prefix": f"{MEDIA_MARKER}Look at this picture. ",
        "suffix": "Is it a cat?",
        "choices": ["yes", "no"],
        "images": [data_uri(PICTURE_A)],
    }
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS, "--decide") as running:
        decided = post(running, "/v1/decide", body)
        assert decided.status_code == 200, decided.text
        other = post(running, "/v1/decide", {**body, "images": [b64(PICTURE_B)]})
        assert other.status_code == 200, other.text
        broken = post(running, "/v1/decide", {**body, "images": [b64(b"not a picture")]})
        assert broken.status_code == 400, broken.text
        assert "images[0]" in broken.json()["error"]["message"]
    assert decided.json() != other.json()
