"""A JSON schema that compiles but allows no finite value, found before any grammar runs.

``{"$ref": "#"}`` (a schema that is itself) and an object whose required property is of
its own type (``{"$defs": {"n": {"properties": {"c": {"$ref": "#/$defs/n"}}, "required":
["c"]}}, "$ref": "#/$defs/n"}``) are valid JSON Schema and compile into a grammar, but no
value ends: a constraint engine runs into them while generating (llguidance stops with no
token allowed, or past its parser's limits). ``dead_end`` finds them before the prefill.

The rule is a least fixpoint over the schema's ``$ref`` targets: a subschema has a finite
value when one of the types it allows has one (an object: its required properties have
one; an array: its first ``minItems`` items have one; any other type, an ``enum`` or a
``const``: yes), all of ``allOf`` and its ``$ref`` have one, and one of ``anyOf`` /
``oneOf`` has. A target counts as having a value only once that follows without assuming
it. What the rule cannot read (a ``$ref`` outside the document, a keyword it does not know)
counts as having a value: it refuses only what surely has none, and the rest is left to the
engine (whose dead end, if any, then ends that request only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bmoe.errors import GrammarError


def _resolve(root: object, ref: object) -> object | None:
    """The subschema a local ``$ref`` (``#``, ``#/$defs/n``) points at; None for any other."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None  # another document, an anchor: not read here
    node: object = root
    for raw in ref.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


class _Reader:
    """One schema document, read for finite values with the targets known to have one."""

    def __init__(self, root: object) -> None:
        self.root = root
        self.finite: set[int] = set()  # id() of the $ref targets known to have a value
        self.targets: dict[int, object] = {}  # every $ref target met, by id()

    def has_value(self, schema: object) -> bool:
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, Mapping):
            return True
        if "$ref" in schema:
            target = _resolve(self.root, schema["$ref"])
            if target is not None:
                self.targets[id(target)] = target
                if id(target) not in self.finite:
                    return False
        all_of, any_of = schema.get("allOf"), [schema.get("anyOf"), schema.get("oneOf")]
        if isinstance(all_of, list) and not all(self.has_value(s) for s in all_of):
            return False
        for alternatives in any_of:
            if (
                isinstance(alternatives, list)
                and alternatives
                and not any(self.has_value(s) for s in alternatives)
            ):
                return False
        return self._own_type(schema)

    def _own_type(self, schema: Mapping[str, Any]) -> bool:
        if "enum" in schema or "const" in schema:
            return True  # literal values (an empty enum is the engine's to refuse)
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list):
            return True  # no type said: null is one
        return any(self._kind(schema, kind) for kind in kinds)

    def _kind(self, schema: Mapping[str, Any], kind: object) -> bool:
        if kind == "object":
            props = schema.get("properties")
            props = props if isinstance(props, Mapping) else {}
            required = schema.get("required")
            names = required if isinstance(required, list) else []
            other = schema.get("additionalProperties", True)
            return all(self.has_value(props.get(n, other)) for n in names if isinstance(n, str))
        if kind == "array":
            least = schema.get("minItems", 0)
            least = least if isinstance(least, int) else 0
            prefix = schema.get("prefixItems")
            items = schema.get("items", True)
            if isinstance(items, list):  # draft 4's tuple form
                prefix, items = items, schema.get("additionalItems", True)
            prefix = prefix if isinstance(prefix, list) else []
            firsts = prefix[: min(least, len(prefix))]
            return all(self.has_value(s) for s in firsts) and (least <= len(prefix) or self.has_value(items))
        return True


def dead_end(schema: object) -> str | None:
    """Why ``schema`` allows no finite value (a few words), or None when it may have one."""
    reader = _Reader(schema)
    seen = (-1, -1)
    while seen != (len(reader.finite), len(reader.targets)):  # until nothing new is learned
        seen = (len(reader.finite), len(reader.targets))
        if reader.has_value(schema):
            return None
        for key, target in list(reader.targets.items()):
            if key not in reader.finite and reader.has_value(target):
                reader.finite.add(key)
    if reader.has_value(schema):
        return None
    if isinstance(schema, Mapping) and _resolve(schema, schema.get("$ref")) is schema:
        return "a reference to itself"
    if reader.targets:
        return "a recursion with no way out (a required property or item of its own type)"
    return "no value satisfies it"


def refuse_dead_ends(schema: object, field: str) -> None:
    """Raise ``GrammarError`` (``where``: ``field``) when ``schema`` allows no finite value."""
    why = dead_end(schema)
    if why is not None:
        raise GrammarError(f"the schema at {field} allows no value ({why})", field)
