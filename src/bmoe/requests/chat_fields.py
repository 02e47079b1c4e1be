"""A chat-completions body as a call's keyword arguments: ``Session.chat(messages, **fields)``.

``ChatFields`` names the fields of a ``/v1/chat/completions`` body a call may give (a typed
``**fields``, so a type checker sees a misspelt or mistyped one), and ``chat_body`` puts
them back into the body the server would have read, for ``parse_chat_completion``: a call
is read, refused and mapped as the server reads that body. A name that is not a field is a
``TypeError`` (the server ignores a key it does not know; a call's typo is caught instead).
``stream`` and ``stream_options`` are not fields here: ``Session.chat_stream`` streams.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

Messages = Sequence[Mapping[str, Any]]
"""OpenAI's chat messages: ``{"role": ..., "content": ...}`` and, for an assistant's calls
and a tool's result, ``tool_calls`` and ``tool_call_id``."""


class ChatFields(TypedDict, total=False):
    """The fields, with OpenAI's names and JSON's types (docs/server.md says what bmoe does
    with each); ``None`` is a field left out."""

    max_tokens: int | None
    max_completion_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None  # llama.cpp's and vLLM's extension
    seed: int | None
    stop: str | list[str] | None
    frequency_penalty: float | None
    presence_penalty: float | None
    logit_bias: dict[str, float] | None  # token ids as strings, as JSON writes them
    logprobs: bool | None
    top_logprobs: int | None
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool | None
    response_format: dict[str, Any] | None
    grammar: str | None  # GBNF, llama.cpp's server's extension
    chat_template_kwargs: dict[str, Any] | None  # {"enable_thinking": false}
    # refused unless left out or at their neutral value, as the server refuses them
    n: int | None
    functions: list[Any] | None
    function_call: Any
    modalities: list[str] | None
    audio: Any
    prediction: Any


FIELDS = frozenset(ChatFields.__optional_keys__)


def chat_body(messages: Messages, fields: Mapping[str, object]) -> dict[str, object]:
    """The chat-completions body ``messages`` and ``fields`` stand for (``TypeError`` for a
    name that is not one of ``ChatFields``)."""
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        streams = " (Session.chat_stream streams a reply)" if unknown[0].startswith("stream") else ""
        raise TypeError(f"chat() got an unexpected keyword argument {unknown[0]!r}{streams}")
    listed: object = messages
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        listed = [dict(m) if isinstance(m, Mapping) else m for m in messages]
    return {**fields, "messages": listed}
