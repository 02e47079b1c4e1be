"""Anthropic's Messages API (``POST /v1/messages``): a body read into the neutral
``ChatRequest``.

``system`` (a string or text blocks) is a system message in front; each message's content
is a string or blocks: ``text``; an assistant's ``tool_use`` (a call, its ``input`` the
arguments); a user's ``tool_result`` (the call's result, a tool message, text or text
blocks; ``is_error`` accepted, the text passed as it is); a user's ``image`` (its
``source`` ``base64`` data, or a ``url`` followed as the ``MediaPolicy`` allows), in the
user's text or in a ``tool_result``'s (the tool message's images: Claude Code's
screenshots); ``thinking`` and ``redacted_thinking`` accepted and kept out of the prompt, as
Anthropic keeps earlier thinking out. Documents are refused by name. ``tools`` with an ``input_schema``
are offered (a server tool, one with another ``type``, is skipped); ``tool_choice`` ``auto``,
``any`` (a call is required), ``tool`` (that one) or ``none``, with
``disable_parallel_tool_use``. ``max_tokens`` is required, as Anthropic requires it.
``thinking`` ``enabled`` (or ``adaptive``) or ``disabled`` switches the template's thinking;
``output_config.format`` (a JSON schema) goes through the constraint engine.

What changes nothing here (``metadata``, ``service_tier``, ``cache_control`` on blocks,
``output_config.effort``...) is accepted and ignored. Every failure is a ``RequestError``
naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.media.images import Image
from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.domain.tools import Tool, ToolCall, ToolChoice, ToolUse
from bmoe.domain.tools.openai_json import FUNCTION_NAME
from bmoe.errors import ConfigError, RequestError
from bmoe.requests.fields import (
    Body,
    opt_bool,
    opt_int,
    opt_number,
    opt_object,
    opt_str,
    refuse_unless,
    stop_strings,
)
from bmoe.requests.image_parts import PartsText
from bmoe.requests.neutral import ChatRequest, Generation, Sampling

STOP_SEQUENCES_MAX = 16
KEPT_OUT = frozenset({"thinking", "redacted_thinking"})


@attrs.frozen(kw_only=True)
class MessagesRequest:
    """A ``/v1/messages`` body: the chat turn (``chat``) and the ``model`` it named, which
    the reply echoes."""

    chat: ChatRequest
    model: str


def parse_messages(
    body: Body, *, counting: bool = False, media: MediaPolicy = INLINE_MEDIA
) -> MessagesRequest:
    """A ``/v1/messages`` body (``counting``: a ``/v1/messages/count_tokens`` one, which has
    no ``max_tokens``) as a request (``RequestError`` when it is not one); ``media`` says
    which image references it may use."""
    refuse_unless(body, "container")
    refuse_unless(body, "mcp_servers", [])
    max_tokens = opt_int(body, "max_tokens", low=1)
    if max_tokens is None and not counting:
        raise RequestError("'max_tokens' is required", "max_tokens")
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"), media)
    generation = Generation(
        model=opt_str(body, "model"),
        max_tokens=max_tokens,
        sampling=Sampling(
            temperature=opt_number(body, "temperature", low=0.0, high=1.0),
            top_p=opt_number(body, "top_p", low=0.0, high=1.0),
            top_k=opt_int(body, "top_k", low=0),
        ),
        stop=stop_strings(body, "stop_sequences", most=STOP_SEQUENCES_MAX),
        stream=bool(opt_bool(body, "stream")),
        constraint=_output_format(body),
        fit_context=True,
    )
    chat = ChatRequest(
        messages=(*system, *messages),
        think=_think(body),
        generation=generation,
        tools=_tool_use(body),
    )
    return MessagesRequest(chat=chat, model=generation.model or "")


def _think(body: Body) -> bool | None:
    thinking = opt_object(body, "thinking")
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind in ("enabled", "adaptive"):
        opt_int(
            thinking, "budget_tokens", low=0
        )  # read, not enforced: the thinking ends when the model ends it
        return True
    if kind == "disabled":
        return False
    raise RequestError("thinking.type must be 'enabled', 'adaptive' or 'disabled'", "thinking.type")


def _output_format(body: Body) -> OutputConstraint | None:
    config = opt_object(body, "output_config") or {}
    fmt = opt_object(config, "format")
    if fmt is None:
        return None
    schema = fmt.get("schema")
    if fmt.get("type") != "json_schema" or not isinstance(schema, dict):
        raise RequestError(
            'output_config.format must be {"type": "json_schema", "schema": {...}}', "output_config.format"
        )
    return OutputConstraint.json_schema(schema)


def _tool_use(body: Body) -> ToolUse | None:
    given = body.get("tools")
    if given is not None and not isinstance(given, list):
        raise RequestError("'tools' must be a list of tools", "tools")
    tools = tuple(
        _tool(t, f"tools[{i}]")
        for i, t in enumerate(given or [])
        if isinstance(t, dict) and t.get("type") in (None, "custom")
    )
    choice_body = opt_object(body, "tool_choice") or {}
    choice, parallel = _choice(choice_body)
    if not tools:
        if choice.mode in ("required", "function"):
            raise RequestError("'tool_choice' needs tools", "tool_choice")
        return None
    try:
        return ToolUse(tools, choice, parallel)
    except ConfigError as exc:
        raise RequestError(str(exc), "tool_choice") from None


def _tool(value: Body, where: str) -> Tool:
    name = value.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise RequestError(f"{where}.name must be 1 to 64 letters, digits, '_', '-' or '.'", f"{where}.name")
    schema = value.get("input_schema")
    if not isinstance(schema, dict):
        raise RequestError(f"{where}.input_schema must be a JSON schema object", f"{where}.input_schema")
    return Tool(name, opt_str(value, "description") or "", schema)


def _choice(value: Body) -> tuple[ToolChoice, bool]:
    parallel = not opt_bool(value, "disable_parallel_tool_use")
    kind = value.get("type", "auto")
    if kind in ("auto", "none"):
        return ToolChoice("auto" if kind == "auto" else "none"), parallel
    if kind == "any":
        return ToolChoice("required"), parallel
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError("tool_choice 'tool' needs a 'name'", "tool_choice.name")
        return ToolChoice("function", name), parallel
    raise RequestError("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")


def _system(value: object) -> tuple[ChatMessage, ...]:
    if value is None or value == "" or value == []:
        return ()
    return (ChatMessage("system", _text_blocks(value, "system")),)


def _messages(value: object, media: MediaPolicy) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of messages", "messages")
    out: list[ChatMessage] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", where)
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            out += _user(content, f"{where}.content", media)
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        else:
            raise RequestError(f"{where}.role must be 'user' or 'assistant', got {role!r}", f"{where}.role")
    return tuple(out)


def _blocks(content: object, where: str) -> list[Body]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content blocks", where)
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise RequestError(f"{where}[{i}] must be a content block", f"{where}[{i}]")
    return content


def _refused(kind: object, where: str) -> RequestError:
    return RequestError(
        f"{where}: content blocks of type {kind!r} are not supported",
        f"{where}.type",
        "unsupported_parameter",
    )


def _user(content: object, where: str, media: MediaPolicy) -> list[ChatMessage]:
    """A user turn: its tool results (tool messages), then its text and images (a user
    message)."""
    results: list[ChatMessage] = []
    parts = PartsText(media)
    for i, block in enumerate(_blocks(content, where)):
        kind, at = _kind(block), f"{where}[{i}]"
        if kind == "text":
            parts.text(_block_text(block, at), at)
        elif kind == "image":
            _image(block, at, parts)
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(f"{at}.tool_use_id must be a string", f"{at}.tool_use_id")
            opt_bool(block, "is_error")
            text, images = _result_blocks(block.get("content", ""), f"{at}.content", media)
            results.append(ChatMessage("tool", text, tool_call_id=call_id, images=images))
        elif kind not in KEPT_OUT:
            raise _refused(kind, at)
    if parts.parts or not results:
        text, images = parts.read()
        results.append(ChatMessage("user", text, images=images))
    return results


def _image(block: Body, where: str, parts: PartsText) -> None:
    """An ``image`` block: its ``source``, ``base64`` data or a ``url``."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise RequestError(f"{where}.source must be an object", f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        opt_str(source, "media_type")  # read, not trusted: mtmd tells the format from the bytes
        parts.base64_image(source.get("data"), f"{where}.source.data", where)
    elif kind == "url":
        parts.image(source.get("url"), f"{where}.source.url", where)
    else:
        raise RequestError(
            f"{where}.source.type must be 'base64' or 'url', got {kind!r}",
            f"{where}.source.type",
            "unsupported_parameter",
        )


def _result_blocks(value: object, where: str, media: MediaPolicy) -> tuple[str, tuple[Image, ...]]:
    """A tool result's content: a string, or text and image blocks."""
    if isinstance(value, str):
        return value, ()
    parts = PartsText(media)
    for i, block in enumerate(_blocks(value, where)):
        kind, at = _kind(block), f"{where}[{i}]"
        if kind == "text":
            parts.text(_block_text(block, at), at)
        elif kind == "image":
            _image(block, at, parts)
        else:
            raise _refused(block.get("type"), at)
    return parts.read()


def _assistant(content: object, where: str) -> ChatMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(_blocks(content, where)):
        kind, at = _kind(block), f"{where}[{i}]"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise RequestError(f"{at} needs an 'id' and a 'name'", at)
            if not isinstance(arguments, dict):
                raise RequestError(f"{at}.input must be an object", f"{at}.input")
            calls.append(ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False)))
        elif kind not in KEPT_OUT:
            raise _refused(kind, at)
    return ChatMessage("assistant", "".join(texts), tool_calls=tuple(calls))


def _kind(block: Body) -> str:
    """A block's ``type`` (a value that is not a string, as its text)."""
    kind = block.get("type")
    return kind if isinstance(kind, str) else repr(kind)


def _block_text(block: Body, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{where}.text must be a string", f"{where}.text")
    return text


def _text_blocks(value: object, where: str) -> str:
    """A string, or text blocks joined by a line break."""
    if isinstance(value, str):
        return value
    texts = []
    for i, block in enumerate(_blocks(value, where)):
        if block.get("type") != "text":
            raise _refused(block.get("type"), f"{where}[{i}]")
        texts.append(_block_text(block, f"{where}[{i}]"))
    return "\n".join(texts)


def count_tokens_body(n: int) -> dict[str, Any]:
    """The answer to ``POST /v1/messages/count_tokens``."""
    return {"input_tokens": n}
