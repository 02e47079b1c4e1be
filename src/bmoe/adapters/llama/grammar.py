"""Constraints as GBNF, llama.cpp's grammar format.

JSON schemas become grammars through llama-cpp-python's own converter
(``llama_cpp.llama_grammar.SchemaConverter``, the port of llama.cpp's
``json-schema-to-grammar``), never a hand-written one. That converter ignores some schema
keywords without a word (numeric bounds, ``not``, ``if``...): a grammar built without
them would let through replies the schema forbids, so a schema that uses one is refused
with a ``GrammarError`` naming the keyword and where it is. A forced tool call is each
tool's parameters converted the same way, inside the family's call syntax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.tools import CallSyntax, Tool
from bmoe.errors import GrammarError

IGNORED_KEYWORDS = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
    }
)
"""Keywords that restrict what is valid and that the converter does not read."""

_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems", "items", "additionalProperties")  # a list or one


def unexpressed(schema: object, where: str = "#") -> list[str]:
    """Each place in ``schema`` that uses a keyword the converter would ignore, as
    ``keyword at #/json/pointer``."""
    if not isinstance(schema, Mapping):
        return []
    found = [f"'{key}' at {where}" for key in schema if key in IGNORED_KEYWORDS]
    for key in _SUBSCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            for name, value in sub.items():
                found += unexpressed(value, f"{where}/{key}/{name}")
    for key in _SUBSCHEMAS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, value in enumerate(sub):
                found += unexpressed(value, f"{where}/{key}/{i}")
        else:
            found += unexpressed(sub, f"{where}/{key}")
    return found


# llama-cpp-python's converter carries no annotations: its calls are untyped here.
def _converter() -> SchemaConverter:
    return SchemaConverter(  # type: ignore[no-untyped-call]
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _format(converter: SchemaConverter) -> str:
    return str(converter.format_grammar())  # type: ignore[no-untyped-call]


def _visit(converter: SchemaConverter, schema: Mapping[str, Any], name: str, what: str) -> str:
    """Add ``schema``'s rules to ``converter`` under ``name``; the rule's name."""
    if not isinstance(schema, Mapping):
        raise GrammarError(f"{what} must be a JSON object")
    refused = unexpressed(schema)
    if refused:
        raise GrammarError(f"{what} uses what bmoe's grammar cannot enforce: {', '.join(refused)}")
    try:
        resolved = converter.resolve_refs(dict(schema), what)
        return str(converter.visit(resolved, name))  # type: ignore[no-untyped-call]
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise GrammarError(f"{what} cannot be turned into a grammar: {exc}") from exc


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def json_schema_gbnf(schema: Mapping[str, Any], what: str = "the JSON schema") -> str:
    """The grammar of JSON values valid against ``schema``."""
    converter = _converter()
    _visit(converter, schema, "", what)
    return _format(converter)


def tool_calls_gbnf(syntax: CallSyntax, tools: Sequence[Tool], parallel: bool) -> str:
    """One call (or, with ``parallel``, one or more) of ``tools`` in ``syntax``, each one's
    arguments valid against its parameters (any JSON object when it has none)."""
    converter = _converter()
    alternatives = []
    for i, tool in enumerate(tools):
        schema = tool.parameters or {"type": "object"}
        args = _visit(converter, schema, f"tool-{i}-arguments", f"the parameters of tool '{tool.name}'")
        head = literal(f"{syntax.head}{tool.name}{syntax.middle}")
        tail = f" {literal(syntax.tail)}" if syntax.tail else ""
        alternatives.append(f"{head} {args}{tail}")
    calls = "call"
    if parallel:
        calls = f"call ({literal(syntax.separator)} call)*" if syntax.separator else "call+"
    opening = f"{literal(syntax.open)} " if syntax.open else ""
    closing = f" {literal(syntax.close)}" if syntax.close else ""
    rules = [
        _format(converter),
        f"call ::= {' | '.join(alternatives)}",
        f"root ::= {opening}{calls}{closing}",
    ]
    return "\n".join(rules)


def constraint_gbnf(constraint: OutputConstraint) -> str:
    """The GBNF text of ``constraint`` (root rule ``root``). Raises ``GrammarError``."""
    if constraint.kind == "gbnf":
        return constraint.grammar
    if constraint.kind == "json_object":
        return json_schema_gbnf({"type": "object"})
    if constraint.kind == "json_schema":
        return json_schema_gbnf(constraint.schema)
    if constraint.syntax is None or not constraint.tools:
        raise GrammarError("a tool-call constraint needs a syntax and at least one tool")
    return tool_calls_gbnf(constraint.syntax, constraint.tools, constraint.parallel)
