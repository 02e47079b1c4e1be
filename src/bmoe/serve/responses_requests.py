"""OpenAI's Responses API (``POST /v1/responses``): a body read into the neutral ``ChatRequest``.

``input`` is a string (one user message) or a list of items: ``message`` items (roles
``user``, ``system``, ``developer``, ``assistant``; text parts ``input_text``/``output_text``),
``function_call`` items (an assistant's call, ``call_id`` its id) and ``function_call_output``
items (the call's result, a tool message, its ``output`` a string or ``input_text`` and
``input_image`` parts, as Codex's ``view_image`` sends a picture); a user message's
``input_image`` parts (``image_url``: a data: URI, base64, or a URL followed as the
``MediaPolicy`` allows; ``detail`` ignored) are its images; ``reasoning`` items are accepted and kept out of
the prompt, as chat templates keep earlier reasoning out. ``instructions`` is a system
message in front. Tools of type ``function`` are offered; tools of other types (a hosted
web search, Codex's ``local_shell``...) are skipped, as llama.cpp's server does, so a
client that lists them still works. ``text.format`` goes through the same constraint
engine as chat completions' ``response_format``.

What cannot be honoured (files, images by ``file_id``, ``background``, a stored ``conversation``, prompt
templates, ``truncation: auto``, log-probabilities) is refused by name; what changes nothing
here (``metadata``, ``user``, ``include``, ``service_tier``, ``prompt_cache_key``...) is
accepted and ignored; what the response object echoes back (``metadata``, the tools, the text
format) is checked first (``bmoe.requests.echoed``: ``metadata`` as OpenAI checks it, no
number that JSON cannot write). Every failure is a ``RequestError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from bmoe.domain.chat import ChatMessage, Role
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.media.images import Image
from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.domain.tools import Tool, ToolCall, ToolChoice, ToolUse
from bmoe.domain.tools.openai_json import FUNCTION_NAME
from bmoe.errors import ConfigError, RequestError
from bmoe.requests.api_requests import SEED_MAX
from bmoe.requests.echoed import finite_json, metadata
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

ITEM_ROLES: dict[str, Role] = {
    "user": "user",
    "system": "system",
    "developer": "system",
    "assistant": "assistant",
}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
THINK_OFF = frozenset({"none", "minimal"})
EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """A ``/v1/responses`` body: its ``input`` as messages (``instructions`` apart, as they
    are not carried to a later response), what the chat turn needs, and what the response
    object echoes back (``echo``: the request's tools, tool choice, text format...)."""

    input: tuple[ChatMessage, ...]
    instructions: str = ""
    previous_response_id: str | None = None
    store: bool = True
    think: bool | None = None
    generation: Generation = attrs.field(factory=Generation)
    tools: ToolUse | None = None
    echo: dict[str, Any] = attrs.field(factory=dict)

    def chat(self, earlier: Sequence[ChatMessage] = ()) -> ChatRequest:
        """The chat turn: the instructions, the stored conversation this one continues
        (``earlier``) and the input."""
        system = (ChatMessage("system", self.instructions),) if self.instructions else ()
        return ChatRequest(
            messages=(*system, *earlier, *self.input),
            think=self.think,
            generation=self.generation,
            tools=self.tools,
        )


def parse_responses(body: Body, media: MediaPolicy = INLINE_MEDIA) -> ResponsesRequest:
    """A ``/v1/responses`` body as a request (``RequestError`` when it is not one);
    ``media`` says which image references its input may use."""
    refuse_unless(body, "background", False)
    refuse_unless(body, "conversation")
    refuse_unless(body, "prompt")
    refuse_unless(body, "truncation", "disabled")
    refuse_unless(body, "top_logprobs", 0)
    instructions = opt_str(body, "instructions") or ""
    tools = _tool_use(body)
    generation = Generation(
        model=opt_str(body, "model"),
        max_tokens=opt_int(body, "max_output_tokens", low=0),
        sampling=Sampling(
            temperature=opt_number(body, "temperature", low=0.0, high=2.0),
            top_p=opt_number(body, "top_p", low=0.0, high=1.0),
            top_k=opt_int(body, "top_k", low=0),
            seed=opt_int(body, "seed", low=0, high=SEED_MAX),
        ),
        stop=stop_strings(body),
        stream=bool(opt_bool(body, "stream")),
        constraint=_text_format(body),
        fit_context=True,
    )
    store = opt_bool(body, "store")
    effort = _effort(body)
    echo = {
        "instructions": instructions or None,
        "max_output_tokens": generation.max_tokens,
        "metadata": metadata(body),
        "parallel_tool_calls": tools.parallel if tools is not None else True,
        "reasoning": {"effort": effort, "summary": None},
        "temperature": generation.sampling.temperature,
        "text": {"format": _echo_format(body)},
        "tool_choice": _echo_choice(tools),
        "tools": [_echo_tool(t) for t in tools.tools] if tools is not None else [],
        "top_p": generation.sampling.top_p,
    }
    return ResponsesRequest(
        input=_input(body.get("input"), media),
        instructions=instructions,
        previous_response_id=opt_str(body, "previous_response_id"),
        store=True if store is None else store,
        think=None if effort is None else effort not in THINK_OFF,
        generation=generation,
        tools=tools,
        echo=echo,
    )


def _effort(body: Body) -> str | None:
    reasoning = opt_object(body, "reasoning") or {}
    effort = opt_str(reasoning, "effort")
    if effort is not None and effort not in EFFORTS:
        raise RequestError(
            f"reasoning.effort must be one of {', '.join(sorted(EFFORTS))}", "reasoning.effort"
        )
    return effort


def _echo_format(body: Body) -> dict[str, Any]:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return {"type": "text"}
    finite_json(fmt, "text.format")  # echoed whole
    return dict(fmt)


def _text_format(body: Body) -> OutputConstraint | None:
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (its ``schema``)."""
    text = opt_object(body, "text")
    fmt = text.get("format") if text is not None else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise RequestError(
                'text.format json_schema needs {"name": ..., "schema": {...}}', "text.format.schema"
            )
        return OutputConstraint.json_schema(schema)
    raise RequestError("text.format.type must be 'text', 'json_object' or 'json_schema'", "text.format.type")


def _tool_use(body: Body) -> ToolUse | None:
    """``tools`` (the ``function`` ones), ``tool_choice`` and ``parallel_tool_calls``."""
    given = body.get("tools")
    if given is not None and not isinstance(given, list):
        raise RequestError("'tools' must be a list of tools", "tools")
    tools = tuple(
        _tool(t, f"tools[{i}]")
        for i, t in enumerate(given or [])
        if isinstance(t, dict) and t.get("type") == "function"
    )
    parallel = opt_bool(body, "parallel_tool_calls")
    choice = _choice(body.get("tool_choice"))
    if not tools:
        if choice.mode in ("required", "function"):
            raise RequestError("'tool_choice' needs function tools", "tool_choice")
        return None
    try:
        return ToolUse(tools, choice, True if parallel is None else parallel)
    except ConfigError as exc:
        raise RequestError(str(exc), "tool_choice") from None


def _tool(value: Body, where: str) -> Tool:
    name = value.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise RequestError(f"{where}.name must be 1 to 64 letters, digits, '_', '-' or '.'", f"{where}.name")
    parameters = value.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise RequestError(f"{where}.parameters must be a JSON schema object", f"{where}.parameters")
    finite_json(parameters, f"{where}.parameters")  # echoed whole
    description = opt_str(value, "description") or ""
    return Tool(name, description, parameters or {})


def _choice(value: object) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice("none" if value == "none" else "required")
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return ToolChoice("function", value["name"])
    shape = '{"type": "function", "name": ...}'
    raise RequestError(f"'tool_choice' must be 'auto', 'none', 'required' or {shape}", "tool_choice")


def _echo_choice(tools: ToolUse | None) -> Any:
    if tools is None or tools.choice.mode in ("auto", "none", "required"):
        return "auto" if tools is None else tools.choice.mode
    return {"type": "function", "name": tools.choice.function}


def _echo_tool(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description or None,
        "parameters": dict(tool.parameters),
        "strict": None,
    }


def _input(value: object, media: MediaPolicy) -> tuple[ChatMessage, ...]:
    if isinstance(value, str):
        if not value:
            raise RequestError("'input' must not be empty", "input")
        return (ChatMessage("user", value),)
    if not isinstance(value, list) or not value:
        raise RequestError("'input' must be a string or a non-empty list of items", "input")
    messages: list[ChatMessage] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where, media))
        elif kind == "function_call":
            call = _call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # calls of one turn join it
                messages[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(f"{where}.call_id must be a string", f"{where}.call_id")
            output, images = _content(item.get("output"), f"{where}.output", media, images=True)
            messages.append(ChatMessage("tool", output, tool_call_id=call_id, images=images))
        elif kind == "reasoning":
            continue  # earlier reasoning stays out of the prompt, as chat templates keep it out
        else:
            raise RequestError(
                f"{where}: input items of type {kind!r} are not supported",
                f"{where}.type",
                "unsupported_parameter",
            )
    if not messages:
        raise RequestError("'input' holds no message", "input")
    return tuple(messages)


def _message(item: Body, where: str, media: MediaPolicy) -> ChatMessage:
    role = item.get("role")
    if not isinstance(role, str) or role not in ITEM_ROLES:
        raise RequestError(
            f"{where}.role must be one of {', '.join(ITEM_ROLES)}, got {role!r}", f"{where}.role"
        )
    text, images = _content(item.get("content"), f"{where}.content", media, images=role == "user")
    return ChatMessage(ITEM_ROLES[role], text, images=images)


def _call(item: Body, where: str) -> ToolCall:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id:
        raise RequestError(f"{where}.call_id must be a string", f"{where}.call_id")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name must be a string", f"{where}.name")
    if not isinstance(arguments, str):
        raise RequestError(f"{where}.arguments must be a JSON text", f"{where}.arguments")
    return ToolCall(call_id, name, arguments or "{}")


def _content(value: object, where: str, media: MediaPolicy, *, images: bool) -> tuple[str, tuple[Image, ...]]:
    """A string, or a list of text parts (joined by a line break) and, where ``images``,
    ``input_image`` parts (a media marker each); files refused."""
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a string or a list of text parts", where)
    parts = PartsText(media)
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        kind = kind if isinstance(kind, str) else repr(kind)
        if isinstance(part, dict) and kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.text(part["refusal"], at)
        elif isinstance(part, dict) and kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.text(part["text"], at)
        elif isinstance(part, dict) and kind == "input_image" and images and part.get("file_id") is None:
            parts.image(part.get("image_url"), f"{at}.image_url", at)
        else:
            only = "text and input_image (by image_url)" if images else "text"
            raise RequestError(
                f"{at}: only {only} parts are supported, got {kind!r}", at, "unsupported_parameter"
            )
    return parts.read()
