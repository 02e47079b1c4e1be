"""Constraints as GBNF, llama.cpp's grammar format: the engine where llguidance is absent.

JSON schemas become grammars through llama-cpp-python's own converter
(``llama_cpp.llama_grammar.SchemaConverter``, the port of llama.cpp's
``json-schema-to-grammar``), never a hand-written one. That converter ignores some schema
keywords without a word (numeric bounds, ``not``, ``if``...): a grammar built without
them would let through replies the schema forbids, so a schema that uses one is refused
with a ``GrammarError`` naming the keyword and where it is. Formats are patterns first
(``schema_rules``). A forced tool call is each tool's parameters converted the same way,
inside the family's call syntax; tools beside a JSON answer are ``root ::= answer | calls``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from bmoe.adapters.llama.guidance import REFUSED
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.schema_rules import enforceable
from bmoe.domain.tools import CallSyntax, Tool
from bmoe.errors import GrammarError

IGNORED_KEYWORDS = REFUSED | frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "patternProperties",
        "minProperties",
        "maxProperties",
    }
)
"""Keywords that restrict what is valid and that the converter does not read: what
llguidance does not enforce either (``guidance.REFUSED``), and the bounds and property
counts it does."""


# llama-cpp-python's converter carries no annotations: its calls are untyped here.
def _converter() -> SchemaConverter:
    return SchemaConverter(  # type: ignore[no-untyped-call]
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _format(converter: SchemaConverter) -> str:
    return str(converter.format_grammar())  # type: ignore[no-untyped-call]


def _visit(converter: SchemaConverter, schema: Mapping[str, Any], name: str, what: str) -> str:
    """Add ``schema``'s rules to ``converter`` under ``name``; the rule's name. ``what``:
    the request field it came from."""
    ready = enforceable(schema, what, IGNORED_KEYWORDS)
    try:
        resolved = converter.resolve_refs(dict(ready), what)
        return str(converter.visit(resolved, name))  # type: ignore[no-untyped-call]
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise GrammarError(f"{what} cannot be turned into a grammar: {exc}", what) from exc


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


def json_schema_gbnf(schema: Mapping[str, Any], what: str = "response_format.json_schema.schema") -> str:
    """The grammar of JSON values valid against ``schema``."""
    converter = _converter()
    _visit(converter, schema, "", what)
    return _format(converter)


def _answer_rule(converter: SchemaConverter, answer: OutputConstraint) -> str:
    schema = answer.schema if answer.kind == "json_schema" else {"type": "object"}
    return _visit(converter, schema, "answer", answer.field)


def tool_calls_gbnf(
    syntax: CallSyntax,
    tools: Sequence[Tool],
    parallel: bool,
    answer: OutputConstraint | None = None,
    fields: Sequence[str] = (),
) -> str:
    """One call (or, with ``parallel``, one or more) of ``tools`` in ``syntax``, each one's
    arguments valid against its parameters (any JSON object when it has none); with an
    ``answer``, that JSON value instead of the calls is also accepted."""
    converter = _converter()
    alternatives = []
    for i, tool in enumerate(tools):
        schema = tool.parameters or {"type": "object"}
        field = fields[i] if i < len(fields) else f"the parameters of tool '{tool.name}'"
        args = _visit(converter, schema, f"tool-{i}-arguments", field)
        head = literal(f"{syntax.head}{tool.name}{syntax.middle}")
        tail = f" {literal(syntax.tail)}" if syntax.tail else ""
        alternatives.append(f"{head} {args}{tail}")
    answer_rule = _answer_rule(converter, answer) if answer is not None else None
    calls = "call"
    if parallel:
        calls = f"call ({literal(syntax.separator)} call)*" if syntax.separator else "call+"
    opening = f"{literal(syntax.open)} " if syntax.open else ""
    closing = f" {literal(syntax.close)}" if syntax.close else ""
    rules = [
        _format(converter),
        f"call ::= {' | '.join(alternatives)}",
        f"calls ::= {opening}{calls}{closing}",
        f"root ::= {answer_rule} | calls" if answer_rule is not None else "root ::= calls",
    ]
    return "\n".join(rules)


def constraint_gbnf(constraint: OutputConstraint) -> str:
    """The GBNF text of ``constraint`` (root rule ``root``). Raises ``GrammarError``."""
    if constraint.kind == "gbnf":
        return constraint.grammar
    if constraint.kind == "json_object":
        return json_schema_gbnf({"type": "object"}, constraint.field)
    if constraint.kind == "json_schema":
        return json_schema_gbnf(constraint.schema, constraint.field)
    if constraint.syntax is None or not constraint.tools:
        raise GrammarError("a tool-call constraint needs a syntax and at least one tool", "tools")
    return tool_calls_gbnf(
        constraint.syntax, constraint.tools, constraint.parallel, constraint.answer, constraint.tool_fields
    )
