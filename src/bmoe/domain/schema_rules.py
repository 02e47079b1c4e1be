"""What a JSON schema asks of a reply, read before any grammar is built.

Three rules, the same whichever engine enforces the schema:

- **Refused keywords**: a keyword the engine does not enforce would let through replies the
  schema forbids, so a schema using one is refused, naming the keyword and where it is (a
  JSON pointer: ``/properties/tags/uniqueItems``). ``unenforced`` finds them, given the
  engine's set of keywords it cannot enforce.
- **Formats as patterns**: ``date``, ``date-time``, ``time``, ``uuid`` and ``email`` become
  a ``pattern`` written here (``with_format_patterns``), so that the values are valid and
  not merely shaped like it: a date's day fits its month, 29 February only in a leap year,
  hours below 24. A ``format`` outside ``FORMAT_PATTERNS`` is refused like a keyword.
- **No unnamed properties by default**: an object schema that lists its ``properties`` and
  says nothing of ``additionalProperties`` gets no other keys (as llama.cpp's own converter
  does). What it writes is still valid against the schema, and a model cannot fill the
  reply with made-up keys; a schema that wants them says ``additionalProperties: true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from bmoe.domain.schema_dead_ends import refuse_dead_ends
from bmoe.errors import GrammarError

_YEAR = r"(\d{3}[1-9]|\d{2}[1-9]\d|\d[1-9]\d{2}|[1-9]\d{3})"  # 0001 to 9999
_LEAP_YEAR = r"(\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)"
    rf"|02-(0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
_HEX = "[0-9a-f]"

FORMAT_PATTERNS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": f"^{_HEX}{{8}}-{_HEX}{{4}}-[1-8]{_HEX}{{3}}-[89ab]{_HEX}{{3}}-{_HEX}{{12}}$",
    "email": (
        r"^[a-z0-9]([a-z0-9._+-]{0,30}[a-z0-9])?@[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?(\.[a-z]{2,12}){1,2}$"
    ),
}
"""Each format's values as a regular expression: RFC 3339's ``full-date``, ``full-time``
(no leap second, at most microseconds, as Python's ``datetime`` reads) and ``date-time``
(upper-case ``T`` and ``Z``); RFC 4122's lower-case UUID (versions 1 to 8); a plain
``local@domain.tld`` address that every validator accepts."""

_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames")


@attrs.frozen
class Unenforced:
    """A keyword the engine cannot enforce, and where: a JSON pointer into the schema."""

    keyword: str
    pointer: str

    def __str__(self) -> str:
        return f"'{self.keyword}' at #{self.pointer}"


def _children(schema: Mapping[str, Any], where: str) -> list[tuple[object, str]]:
    """Every subschema of ``schema`` with its pointer."""
    found: list[tuple[object, str]] = []
    for key in _SUBSCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            found += [(value, f"{where}/{key}/{_escape(name)}") for name, value in sub.items()]
    for key in (*_SUBSCHEMA_LISTS, *_SUBSCHEMAS):
        sub = schema.get(key)
        if isinstance(sub, list):
            found += [(value, f"{where}/{key}/{i}") for i, value in enumerate(sub)]
        elif sub is not None:
            found.append((sub, f"{where}/{key}"))
    return found


def _escape(name: str) -> str:
    """A property name as a JSON pointer token (RFC 6901)."""
    return str(name).replace("~", "~0").replace("/", "~1")


def unenforced(schema: object, refused: frozenset[str], where: str = "") -> list[Unenforced]:
    """Each place in ``schema`` that uses a keyword of ``refused``, or a ``format`` that
    ``FORMAT_PATTERNS`` does not write, in document order."""
    if not isinstance(schema, Mapping):
        return []
    found = [Unenforced(key, f"{where}/{key}") for key in schema if key in refused]
    fmt = schema.get("format")
    if fmt is not None and fmt not in FORMAT_PATTERNS:
        found.append(Unenforced(f"format: {fmt}", f"{where}/format"))
    elif fmt is not None and "pattern" in schema:
        found.append(Unenforced(f"format: {fmt} beside a pattern", f"{where}/format"))
    for sub, at in _children(schema, where):
        found += unenforced(sub, refused, at)
    return found


def enforceable(schema: object, field: str, refused: frozenset[str]) -> Mapping[str, Any]:
    """``schema`` (from the request's ``field``) made ready for an engine that cannot
    enforce ``refused``: its formats as patterns, its objects closed. Raises
    ``GrammarError`` naming every keyword it cannot enforce, ``where`` the first one's
    pointer (``field#/pointer``), or for a schema that allows no finite value
    (``schema_dead_ends``: a reference to itself, a required recursion), ``where`` the field."""
    if not isinstance(schema, Mapping):
        raise GrammarError(f"{field} must be a JSON object", field)
    found = unenforced(schema, refused)
    if found:
        listed = ", ".join(str(r) for r in found)
        raise GrammarError(
            f"{field} uses what bmoe's grammar cannot enforce: {listed}", f"{field}#{found[0].pointer}"
        )
    ready: Mapping[str, Any] = with_format_patterns(schema)
    refuse_dead_ends(ready, field)  # compiles, yet no value ends: refused before the prefill
    return ready


def with_format_patterns(schema: object) -> Any:
    """``schema`` with every known ``format`` replaced by its ``pattern`` and objects closed
    to unnamed properties (a new value; the argument is not changed). Call after
    ``unenforced`` found nothing."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: with_format_patterns(value) for name, value in out[key].items()}
    for key in (*_SUBSCHEMA_LISTS, *_SUBSCHEMAS):
        sub = out.get(key)
        if isinstance(sub, list):
            out[key] = [with_format_patterns(value) for value in sub]
        elif isinstance(sub, Mapping):
            out[key] = with_format_patterns(sub)
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_PATTERNS and "pattern" not in out:
        del out["format"]
        out["pattern"] = FORMAT_PATTERNS[fmt]
    if isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
