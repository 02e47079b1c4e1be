"""What a chat template is given when a request offers tools.

A template that renders tools itself gets the conversation as OpenAI-style dicts and the
tools as its ``tools`` variable. For a template that ignores tools (``generic``), bmoe
writes them into the system message, with the syntax to call them in, and writes past calls
into the assistant turns as that syntax: the model sees what it is asked to write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bmoe.domain.chat import ChatMessage
from bmoe.domain.tools.formats import SYNTAX, ToolFormat
from bmoe.domain.tools.values import ToolUse

GENERIC_INSTRUCTIONS = (
    "You can call these tools (JSON schemas of their parameters):\n{tools}\n"
    "To call one, answer with one block per call, and nothing after the last block:\n"
    '<tool_call>\n{{"name": "NAME", "arguments": {{...}}}}\n</tool_call>'
)


def generic_tools_message(use: ToolUse) -> str:
    """The system text that shows a ``generic`` template's model the tools."""
    tools = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in use.tools)
    return GENERIC_INSTRUCTIONS.format(tools=tools)


def template_messages(
    messages: Sequence[ChatMessage], fmt: ToolFormat | None, use: ToolUse | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the ``tools`` variable to render ``messages`` with.

    ``fmt`` ``generic`` (the template ignores tools): the tools go into the system message
    (one is added first if there is none), past calls into their turns' content in Hermes
    blocks, and no ``tools`` variable is passed. Otherwise the messages as dicts and, when
    ``use`` is active, its tools."""
    active = use is not None and use.active
    if fmt is not ToolFormat.GENERIC:
        tools = [t.as_openai() for t in use.tools] if use is not None and active else None
        return [m.as_template_dict() for m in messages], tools
    out = []
    for m in messages:
        d = m.as_template_dict()
        if m.tool_calls:
            del d["tool_calls"]
            calls = SYNTAX[ToolFormat.GENERIC].write([(c.name, c.arguments) for c in m.tool_calls])
            d["content"] = f"{m.content}\n{calls}" if m.content else calls
        out.append(d)
    if active and use is not None:
        text = generic_tools_message(use)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None
