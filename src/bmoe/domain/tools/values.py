"""Tools a model may call, how a request lets it choose, and the calls it made.

OpenAI's shapes, as values: a ``Tool`` is a function with a JSON-schema ``parameters``
object; ``ToolChoice`` is ``auto`` (the model decides), ``none`` (no tool: they are not even
shown), ``required`` (at least one call) or one named function; a ``ToolCall`` is what a
reply asked for, its ``arguments`` a JSON text (as OpenAI sends them).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from bmoe.errors import ConfigError

ChoiceMode = Literal["auto", "none", "required", "function"]
JsonObject = Mapping[str, Any]

_ID_ALPHABET = string.ascii_letters + string.digits
CALL_ID_LENGTH = 9
"""The length of the ids a chat template sees: Mistral's templates refuse any other."""


def new_call_id() -> str:
    """A fresh call id, in OpenAI's shape: ``call_`` and 24 letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def template_call_id(call_id: str) -> str:
    """The id a chat template is shown for ``call_id``: itself when it is already 9 letters
    and digits, else 9 drawn from its hash (the same for the call and its result)."""
    if len(call_id) == CALL_ID_LENGTH and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode("utf-8")).digest()[:8], "big")
    digits = []
    for _ in range(CALL_ID_LENGTH):
        number, digit = divmod(number, len(_ID_ALPHABET))
        digits.append(_ID_ALPHABET[digit])
    return "".join(digits)


@attrs.frozen
class Tool:
    """One function the model may call. ``parameters`` is a JSON schema (an object schema
    by OpenAI's rule); ``{}`` when the request gave none."""

    name: str
    description: str = ""
    parameters: JsonObject = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a tool needs a name")

    def as_openai(self) -> dict[str, Any]:
        """``{"type": "function", "function": {...}}``: how chat templates iterate ``tools``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = (
            dict(self.parameters) if self.parameters else {"type": "object", "properties": {}}
        )
        return {"type": "function", "function": function}


@attrs.frozen
class ToolChoice:
    """``mode`` ``function`` names its ``function``; the other modes name none."""

    mode: ChoiceMode = "auto"
    function: str = ""

    def __attrs_post_init__(self) -> None:
        if (self.mode == "function") != bool(self.function):
            raise ConfigError("tool_choice names a function exactly when its mode is 'function'")

    @property
    def forced(self) -> bool:
        """The reply must be a call (``required`` or a named function)."""
        return self.mode in ("required", "function")


@attrs.frozen
class ToolUse:
    """What a request offers: its ``tools``, the ``choice`` and whether a reply may hold
    several calls (``parallel``, OpenAI's ``parallel_tool_calls``, default true)."""

    tools: tuple[Tool, ...]
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    def __attrs_post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError("two tools have the same name")
        if self.choice.mode == "function" and self.choice.function not in names:
            raise ConfigError(f"tool_choice names '{self.choice.function}', which is not among the tools")
        if self.choice.mode != "none" and not self.tools:
            raise ConfigError(f"tool_choice '{self.choice.mode}' needs at least one tool")

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its reply is read for calls."""
        return self.choice.mode != "none" and bool(self.tools)

    @staticmethod
    def shown(use: ToolUse | None) -> ToolUse | None:
        """``use`` when it is active (tools shown, the reply read for calls), else ``None``."""
        return use if use is not None and use.active else None

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools a forced reply may call: the named one, or all."""
        if self.choice.mode == "function":
            return tuple(t for t in self.tools if t.name == self.choice.function)
        return self.tools


@attrs.frozen
class ToolCall:
    """A call a reply made: ``arguments`` is a JSON text (an object)."""

    id: str
    name: str
    arguments: str = "{}"

    def arguments_object(self) -> Any:
        """The arguments parsed (what chat templates render back into the history)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments

    def as_openai(self) -> dict[str, Any]:
        """``{"id", "type": "function", "function": {"name", "arguments"}}`` with the
        arguments as a JSON text (the API's shape)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
