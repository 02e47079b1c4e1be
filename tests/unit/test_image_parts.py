"""Images in the three APIs' bodies (no model): each dialect's image part becomes a media
marker in its message's text and an ``Image`` in ``ChatMessage.images``, in order; the same
picture is the same ``Image`` whichever API sent it; images where they cannot go are refused
by name; text-only bodies read as they always have. Following references (data URIs,
base64, remote, files): ``test_image_sources.py``."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.media import MEDIA_MARKER, Image
from bmoe.domain.media.references import MediaPolicy
from bmoe.errors import RequestError
from bmoe.requests.api_requests import parse_chat_completion
from bmoe.requests.chat_fields import chat_body
from bmoe.requests.mapping import ServeDefaults, chat_turn
from bmoe.serve.messages_requests import parse_messages
from bmoe.serve.responses_requests import parse_responses

# a 1x1 PNG: what the picture is does not matter here (mtmd decodes it, later)
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
JPEG = b"\xff\xd8\xff\xe0 not really a jpeg"
B64 = base64.b64encode(PNG).decode()
URI = f"data:image/png;base64,{B64}"
JPEG_URI = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
M = MEDIA_MARKER


def chat_user(*parts: Any) -> ChatMessage:
    return parse_chat_completion({"messages": [{"role": "user", "content": list(parts)}]}).messages[0]


def text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def test_chat_completions_image_url_parts_become_markers_and_images_in_order() -> None:
    message = chat_user(
        text("Compare"),
        {"type": "image_url", "image_url": {"url": URI, "detail": "high"}},
        text("with"),
        {"type": "image_url", "image_url": JPEG_URI},  # llama.cpp's string form
    )
    assert message.content == f"Compare\n{M}\nwith\n{M}"
    assert message.images == (Image(PNG), Image(JPEG))
    assert [i.name for i in message.images] == ["messages[0].content[1]", "messages[0].content[3]"]


def test_an_image_alone_is_a_user_message_s_whole_content() -> None:
    message = chat_user({"type": "image_url", "image_url": {"url": B64}})  # bare base64
    assert (message.content, message.images) == (M, (Image(PNG),))


def test_anthropic_image_blocks_become_markers_and_images_in_order() -> None:
    body = {
        "max_tokens": 5,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
                    text("What is it?"),
                    {"type": "image", "source": {"type": "url", "url": JPEG_URI}},
                ],
            }
        ],
    }
    (message,) = parse_messages(body).chat.messages
    assert message.content == f"{M}\nWhat is it?\n{M}"
    assert message.images == (Image(PNG), Image(JPEG))
    assert message.images[0].name == "messages[0].content[0]"


def test_an_anthropic_tool_result_carries_its_screenshot() -> None:
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    body = {
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "Take a screenshot"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [text("done"), shot]}],
            },
        ],
    }
    result = parse_messages(body).chat.messages[-1]
    assert (result.role, result.tool_call_id) == ("tool", "t1")
    assert (result.content, result.images) == (f"done\n{M}", (Image(PNG),))
    assert result.images[0].name == "messages[2].content[0].content[1]"


def test_responses_input_image_parts_become_markers_and_images_in_order() -> None:
    body = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Compare"},
                    {"type": "input_image", "image_url": URI, "detail": "auto"},
                    {"type": "input_image", "image_url": JPEG_URI},
                ],
            }
        ]
    }
    (message,) = parse_responses(body).input
    assert message.content == f"Compare\n{M}\n{M}"
    assert message.images == (Image(PNG), Image(JPEG))
    assert message.images[1].name == "input[0].content[2]"


def test_codex_view_image_results_carry_the_picture() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"}
    as_output = {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_image", "image_url": URI}],
    }
    asked = parse_responses({"input": [{"role": "user", "content": "Look"}, call, as_output]})
    assert (asked.input[-1].role, asked.input[-1].content, asked.input[-1].images) == (
        "tool",
        M,
        (Image(PNG),),
    )
    # the older shape: the result's text, then the picture in a user message
    plain = {"type": "function_call_output", "call_id": "c1", "output": "attached"}
    picture = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": URI}]}
    asked = parse_responses({"input": [{"role": "user", "content": "Look"}, call, plain, picture]})
    assert asked.input[-1] == ChatMessage("user", M, images=(Image(PNG),))


def test_the_same_picture_is_the_same_image_whichever_api_sent_it() -> None:
    chat = chat_user({"type": "image_url", "image_url": {"url": URI}})
    anthropic = parse_messages(
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": B64}}]}
            ],
        }
    ).chat.messages[0]
    responses = parse_responses(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": URI}]}]}
    ).input[0]
    assert chat == anthropic == responses == ChatMessage("user", M, images=(Image(PNG),))


def test_session_chat_and_llama_s_message_shape_carry_images_to_the_turn() -> None:
    """``Session.chat`` and ``bmoe.Llama.create_chat_completion`` read their messages as
    this body (``chat_body``, ``parse_chat_completion``) and map it with ``chat_turn``."""
    messages = [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": URI}}, text("Describe")]},
    ]
    turn = chat_turn(parse_chat_completion(chat_body(messages, {"max_tokens": 8})), ServeDefaults())
    assert turn.request.prompt == f"{M}\nDescribe"
    assert turn.request.images == (Image(PNG),)


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (
            parse_chat_completion,
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "image_url", "image_url": URI}]},
                    {"role": "user", "content": "q"},
                ]
            },
            "messages[0].content[0]",
        ),
        (
            parse_chat_completion,
            {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": URI}]}]},
            "messages[0].content[0]",
        ),
        (
            parse_chat_completion,
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].image_url.url",
        ),
        (
            parse_chat_completion,
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "%%%"}]}]},
            "messages[0].content[0].image_url",
        ),
        (
            parse_chat_completion,  # text that would take an image's place
            {
                "messages": [
                    {"role": "user", "content": [text(f"a {M}"), {"type": "image_url", "image_url": URI}]}
                ]
            },
            "messages[0].content[0]",
        ),
        (
            parse_responses,
            {"input": [{"role": "system", "content": [{"type": "input_image", "image_url": URI}]}]},
            "input[0].content[0]",
        ),
        (
            parse_responses,
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
            "input[0].content[0]",
        ),
        (
            parse_responses,
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            lambda b: parse_messages({"max_tokens": 5, **b}),
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
            "messages[0].content[0].source.type",
        ),
        (
            lambda b: parse_messages({"max_tokens": 5, **b}),
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}],
                    }
                ]
            },
            "messages[0].content[0].source.data",
        ),
        (
            lambda b: parse_messages({"max_tokens": 5, **b}),
            {"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
    ],
)
def test_an_image_that_cannot_be_taken_is_refused_by_name(
    parse: Any, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as info:
        parse(body)
    assert info.value.param == param
    assert str(info.value).startswith(param.removesuffix(".type"))


def test_remote_images_are_refused_by_name_unless_the_server_fetches_them() -> None:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(RequestError) as info:
        chat_user(text("Hi"), part)
    assert info.value.param == "messages[0].content[1].image_url.url"
    assert str(info.value) == (
        "messages[0].content[1].image_url.url: remote image URLs are off "
        "(start the server with --allow-remote-media to fetch them)"
    )
    anthropic = {"type": "image", "source": {"type": "url", "url": "http://example.com/cat.png"}}
    with pytest.raises(RequestError, match="remote image URLs are off") as info:
        parse_messages({"max_tokens": 5, "messages": [{"role": "user", "content": [anthropic]}]})
    assert info.value.param == "messages[0].content[0].source.url"


TEXT_BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "user", "content": [text("a"), text("b")]}]},
    {"messages": [{"role": "user", "content": f"a literal {M} in text"}]},
]


@pytest.mark.parametrize("body", TEXT_BODIES)
def test_text_only_bodies_read_as_before_whatever_the_policy(body: dict[str, Any], tmp_path: Any) -> None:
    asked = parse_chat_completion(body)
    assert all(m.images == () for m in asked.messages)
    reaching = MediaPolicy(allow_remote=True, media_path=tmp_path.resolve())
    assert parse_chat_completion(body, reaching) == asked
    responses = {"input": body["messages"][0]["content"]}
    if isinstance(responses["input"], str):
        assert parse_responses(responses).input == (ChatMessage("user", responses["input"]),)
