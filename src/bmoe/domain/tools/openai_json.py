"""OpenAI's JSON for tools, read into ``ToolUse`` and ``ToolCall`` values.

Shared by the server (``tools``, ``tool_choice``, ``parallel_tool_calls``, an assistant
message's ``tool_calls``) and the line protocol's ``generate``, so both accept the same
shapes. A wrong shape raises ``ToolSpecError`` naming where (``tools[1].function.name``).
"""

from __future__ import annotations

import re

from bmoe.domain.tools.values import Tool, ToolCall, ToolChoice, ToolUse
from bmoe.errors import ConfigError

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""OpenAI's rule for a function's name (with dots, which gpt-oss's namespaces use)."""


class ToolSpecError(ConfigError):
    """A tools field that is not OpenAI's shape; ``where`` names the field."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not FUNCTION_NAME.match(value):
        raise ToolSpecError(f"{where} must be 1 to 64 letters, digits, '_', '-' or '.'", where)
    return value


def read_tool_use(tools: object, choice: object = None, parallel: object = None) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (``None``: no tools offered)."""
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolSpecError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ToolSpecError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolSpecError("'tools' must be a list of tools", "tools")
    read = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    try:
        return ToolUse(read, _choice(choice), True if parallel is None else parallel)
    except ToolSpecError:
        raise
    except ConfigError as exc:
        raise ToolSpecError(str(exc), "tool_choice") from None


def _tool(value: object, where: str) -> Tool:
    if (
        not isinstance(value, dict)
        or value.get("type") != "function"
        or not isinstance(value.get("function"), dict)
    ):
        raise ToolSpecError(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
    function = value["function"]
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ToolSpecError(
            f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters"
        )
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ToolSpecError(f"{where}.function.description must be a string", f"{where}.function.description")
    return Tool(_name(function.get("name"), f"{where}.function.name"), description, parameters or {})


def _choice(value: object) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value == "none":
        return ToolChoice("none")
    if value == "required":
        return ToolChoice("required")
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
    ):
        return ToolChoice("function", _name(value["function"].get("name"), "tool_choice.function.name"))
    shape = '{"type": "function", "function": {"name": ...}}'
    raise ToolSpecError(f"'tool_choice' must be 'auto', 'none', 'required' or {shape}", "tool_choice")


def read_tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` (arguments as a JSON text, as OpenAI sends them)."""
    if value is None or value == []:
        return ()
    if not isinstance(value, list):
        raise ToolSpecError(f"{where} must be a list", where)
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ToolSpecError(
                f'{at} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', at
            )
        arguments = call["function"].get("arguments", "{}")
        if not isinstance(arguments, str):
            raise ToolSpecError(f"{at}.function.arguments must be a JSON text", f"{at}.function.arguments")
        call_id = call.get("id") or ""
        if not isinstance(call_id, str):
            raise ToolSpecError(f"{at}.id must be a string", f"{at}.id")
        calls.append(ToolCall(call_id, _name(call["function"].get("name"), f"{at}.function.name"), arguments))
    return tuple(calls)
