"""What a reply must look like: a grammar the sampler enforces token by token.

``OutputConstraint`` names the form; the session turns it into GBNF (llama.cpp's grammar
format) and hands it to llama.cpp's grammar sampler: ``gbnf`` is given as is, ``json_object``
is any JSON object, ``json_schema`` a JSON value valid against ``schema`` (converted by
llama-cpp-python's schema converter), ``tool_calls`` one or more calls written in a family's
syntax, each one's arguments valid against its tool's parameters: a forced tool choice, or,
with an ``answer`` (tools in ``auto`` beside a response format), either such calls or that
answer. With no constraint the sampler chain is what it was.

``field`` names where in the request each schema came from (``response_format.json_schema
.schema``, ``tools[0].function.parameters``), so a refusal can name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from bmoe.domain.tools.formats import SYNTAX, CallSyntax, ToolFormat
from bmoe.domain.tools.values import Tool, ToolUse
from bmoe.errors import ConfigError

ConstraintKind = Literal["gbnf", "json_object", "json_schema", "tool_calls"]


@attrs.frozen
class OutputConstraint:
    """``gbnf``: ``grammar`` is GBNF text (root rule ``root``); ``json_schema``: ``schema``
    is the JSON schema; ``json_object``: neither; ``tool_calls``: ``syntax``, the ``tools``
    a call may name, whether several calls may follow one another (``parallel``) and the
    ``answer`` the model may write instead of calls (``None``: it must call)."""

    kind: ConstraintKind
    grammar: str = ""
    schema: Mapping[str, Any] = attrs.field(factory=dict)
    syntax: CallSyntax | None = None
    tools: tuple[Tool, ...] = ()
    parallel: bool = False
    answer: OutputConstraint | None = None
    field: str = "response_format.json_schema.schema"
    tool_fields: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if (self.kind == "gbnf") != bool(self.grammar):
            raise ConfigError("a gbnf constraint needs its grammar text, and only it has one")

    @classmethod
    def gbnf(cls, text: str) -> OutputConstraint:
        return cls("gbnf", grammar=text)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> OutputConstraint:
        return cls("json_schema", schema=schema)

    @classmethod
    def tool_calls(
        cls, fmt: ToolFormat, use: ToolUse, answer: OutputConstraint | None = None
    ) -> OutputConstraint:
        """A reply that is only calls of ``use``'s callable tools, in ``fmt``'s syntax, or,
        given an ``answer`` (a JSON constraint), either those calls or that answer."""
        if answer is not None and answer.kind not in ("json_object", "json_schema"):
            raise ConfigError("only a JSON response format can stand beside tools")
        syntax = SYNTAX[fmt]
        tools = use.callable
        fields = tuple(f"tools[{use.tools.index(t)}].function.parameters" for t in tools)
        parallel = use.parallel and syntax.parallel
        return cls(
            "tool_calls", syntax=syntax, tools=tools, parallel=parallel, answer=answer, tool_fields=fields
        )
