"""The syntaxes in which chat models write tool calls, and how to tell a template's.

A model calls a tool by writing text in the syntax its chat template renders calls in (a
template shows the model its past calls the way it was trained to write them). bmoe reads
five families, the ones the vendored templates (``tests/data/chat_templates``) use:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block
  per call (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro and 3, SmolLM3);
- ``harmony``: gpt-oss's channels, ``<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{...}<|call|>``, one call per turn;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral Nemo);
- ``mistral-args``: ``[TOOL_CALLS]NAME[ARGS]{...}`` per call (Mistral Small 3.2, Devstral,
  Ministral 3);
- ``llama3``: a bare ``{"name": ..., "parameters": {...}}`` object, one call per turn
  (Llama 3.1, 3.2, 3.3);

and a sixth of its own, ``generic``, for a template that does not render tools at all (the
tiny models' ChatML): bmoe describes the tools in a system message and asks for Hermes
blocks. A template that renders tools in another syntax (Command R's ``Action:``,
functionary's ``<function=``, DeepSeek's, Kimi's, GLM's ``<arg_key>``, Granite 3's
``<|tool_call|>``, Qwen3-Coder's XML, MiniMax's ``<invoke>``, Apriel's ``<tool_calls>[``...)
is not read: a request with tools is refused rather than answered with calls nobody parses.
"""

from __future__ import annotations

import enum

import attrs


class ToolFormat(enum.Enum):
    HERMES = "hermes"
    HARMONY = "harmony"
    MISTRAL = "mistral"
    MISTRAL_ARGS = "mistral-args"
    LLAMA3 = "llama3"
    GENERIC = "generic"


@attrs.frozen
class CallSyntax:
    """One call is ``head NAME middle ARGUMENTS tail``; several are ``open`` then the calls
    joined by ``separator`` then ``close``. ``parallel``: the family can write several."""

    head: str
    middle: str
    tail: str = ""
    separator: str = ""
    open: str = ""
    close: str = ""
    parallel: bool = True

    def write(self, calls: list[tuple[str, str]]) -> str:
        """The text of ``(name, arguments JSON)`` calls, as a model of the family writes
        them (a forced reply's grammar accepts exactly this shape)."""
        body = self.separator.join(f"{self.head}{name}{self.middle}{args}{self.tail}" for name, args in calls)
        return f"{self.open}{body}{self.close}"


SYNTAX: dict[ToolFormat, CallSyntax] = {
    ToolFormat.HERMES: CallSyntax('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n"),
    ToolFormat.GENERIC: CallSyntax('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n"),
    ToolFormat.HARMONY: CallSyntax(
        "<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", parallel=False
    ),
    ToolFormat.MISTRAL: CallSyntax('{"name": "', '", "arguments": ', "}", ", ", "[TOOL_CALLS][", "]"),
    ToolFormat.MISTRAL_ARGS: CallSyntax("[TOOL_CALLS]", "[ARGS]"),
    ToolFormat.LLAMA3: CallSyntax('{"name": "', '", "parameters": ', "}", parallel=False),
}

MARKER: dict[ToolFormat, str] = {
    ToolFormat.HERMES: "<tool_call>",
    ToolFormat.GENERIC: "<tool_call>",
    ToolFormat.MISTRAL: "[TOOL_CALLS]",
    ToolFormat.MISTRAL_ARGS: "[TOOL_CALLS]",
    ToolFormat.HARMONY: "<|channel|>",
    ToolFormat.LLAMA3: "{",
}
"""The text a call begins with: a streamed reply is held back from it on."""

_NOT_READ = (
    "<function=",  # functionary, Qwen3-Coder
    "<arg_key>",  # GLM
    "Action:",  # Command R
    "<|tool_call|>",  # Granite 3
    "<｜tool",  # DeepSeek
    "<|tool_calls_section_begin|>",  # Kimi
    "functools[",  # firefunction
    "<invoke",  # MiniMax
    "<tool_calls>[",  # Apriel 1.5
)


def detect_format(template: str, renders_tools: bool) -> ToolFormat | None:
    """The family a chat template's source writes calls in; ``None`` when it renders tools in
    a syntax bmoe does not read. ``renders_tools``: rendering with a tool differs from
    rendering without (else the template ignores tools: ``generic``)."""
    if "<|channel|>" in template:
        return ToolFormat.HARMONY
    if "[TOOL_CALLS]" in template:
        return ToolFormat.MISTRAL_ARGS if "[ARGS]" in template else ToolFormat.MISTRAL
    if not renders_tools:
        return ToolFormat.GENERIC
    if any(mark in template for mark in _NOT_READ):
        return None
    if "<tool_call>" in template:
        return ToolFormat.HERMES
    if "<|start_header_id|>" in template and "ipython" in template:
        return ToolFormat.LLAMA3
    return None
