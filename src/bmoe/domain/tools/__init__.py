"""Tool calls: the values (``values``), the families' syntaxes (``formats``) and reading
calls back out of replies (``replies``). ``prompting`` (what a template is given) is imported
by its path: it depends on ``bmoe.domain.chat``, which depends on ``values``."""

from bmoe.domain.tools.formats import SYNTAX, CallSyntax, ToolFormat, detect_format
from bmoe.domain.tools.replies import ReplyGate, ToolReply, parse_reply
from bmoe.domain.tools.values import Tool, ToolCall, ToolChoice, ToolUse, new_call_id

__all__ = [
    "SYNTAX",
    "CallSyntax",
    "ReplyGate",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolFormat",
    "ToolReply",
    "ToolUse",
    "detect_format",
    "new_call_id",
    "parse_reply",
]
