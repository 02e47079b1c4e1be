"""What one turn asks of the context: the tokens it must hold before the answer (the chat
template's rendering of the conversation, or the raw transcript and the new text), the
grammar the answer follows, and whether it thinks first.

Pure policy over the ports (``IGenerateBackend`` tokenizes, ``IChatRenderer`` renders);
``SessionEngine`` keeps the conversation and calls these for each turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import Image, count_markers
from bmoe.domain.tools import ToolUse
from bmoe.errors import ConfigError, ImageError, ToolFormatError
from bmoe.ports.generate_backend import IChatRenderer, IGenerateBackend


def constraint(renderer: IChatRenderer, request: GenerateRequest) -> OutputConstraint | None:
    """The grammar the reply follows: the request's; a forced tool choice's calls (a
    response format waits for the turn after the tools' results, as OpenAI does); with
    tools in ``auto`` beside a JSON response format, either calls or that answer."""
    tools = ToolUse.shown(request.tools)
    if tools is None or (request.constraint is None and not tools.choice.forced):
        return request.constraint
    fmt = renderer.tool_format
    if fmt is None:
        raise ToolFormatError("the chat template writes tool calls in a syntax bmoe does not read", "tools")
    if tools.choice.forced:
        return OutputConstraint.tool_calls(fmt, tools)
    if request.constraint is not None and request.constraint.kind == "gbnf":
        raise ConfigError("a GBNF grammar cannot stand beside tools (give a JSON response format)", "grammar")
    return OutputConstraint.tool_calls(fmt, tools, answer=request.constraint)


def thinks(renderer: IChatRenderer, request: GenerateRequest, default: bool) -> bool:
    """Whether the turn thinks first (``default`` where the request leaves it unsaid); a
    constrained reply starts with its first constrained token: it does not think."""
    if constraint(renderer, request) is None:
        return default if request.think is None else request.think
    if request.think:
        raise ConfigError(
            "a reply held to a grammar (response format, forced tool) cannot think first",
            "chat_template_kwargs.enable_thinking",
        )
    return False


def chat_tokens(
    backend: IGenerateBackend,
    renderer: IChatRenderer,
    request: GenerateRequest,
    past: Sequence[ChatMessage],
    *,
    think: bool,
) -> list[int]:
    """The chat template's rendering of ``past`` and the request's message, tokenized."""
    tools = ToolUse.shown(request.tools)
    if tools is not None and renderer.tool_format is None:
        raise ToolFormatError(
            "this model's chat template writes tool calls in a syntax bmoe does not read "
            "(it reads Hermes/Qwen <tool_call>, gpt-oss channels, Mistral [TOOL_CALLS] "
            "and Llama 3.x JSON; docs/server.md)"
        )
    messages = [*past, turn_message(request)]
    text = renderer.render(messages, enable_thinking=think, tools=tools)
    return tokenize(backend, text, [image for m in messages for image in m.images])


def raw_tokens(backend: IGenerateBackend, request: GenerateRequest, transcript: Sequence[int]) -> list[int]:
    """A raw (not chat) turn: the transcript so far, then the request's text."""
    if ToolUse.shown(request.tools) is not None or request.role != "user":
        raise ConfigError("tools and tool results need chat mode")
    return [*transcript, *tokenize(backend, request.prompt, request.images)]


def tokenize(backend: IGenerateBackend, text: str, images: Sequence[Image]) -> list[int]:
    """A prompt's tokens, its images as rows where it places any."""
    if not images:
        return backend.tokenize(text)
    if count_markers(text) != len(images):
        raise ImageError(
            f"the chat template placed {count_markers(text)} of the conversation's "
            f"{len(images)} images (it drops images in some messages?)",
            "images",
        )
    return backend.tokenize_media(text, images)


def turn_message(request: GenerateRequest) -> ChatMessage:
    """The message a request adds to the conversation: a user's, or a tool's result."""
    return ChatMessage(request.role, request.prompt, tool_call_id=request.tool_call_id, images=request.images)
