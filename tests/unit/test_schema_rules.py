"""``schema_rules``: refused keywords found with their JSON pointers, formats written as
patterns whose matches are valid values (checked against Python's own parsers), objects
closed to unnamed keys."""

from __future__ import annotations

import datetime
import re

import pytest

from bmoe.domain.schema_rules import FORMAT_PATTERNS, Unenforced, unenforced, with_format_patterns

REFUSED = frozenset({"uniqueItems", "not"})


def test_refused_keywords_are_found_with_their_pointers_in_document_order() -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"not": {"type": "null"}}, "uniqueItems": True},
            "a/b": {"anyOf": [{"type": "string", "format": "hostname"}]},
        },
        "$defs": {"x": {"uniqueItems": False}},
    }
    assert unenforced(schema, REFUSED) == [
        Unenforced("uniqueItems", "/properties/tags/uniqueItems"),
        Unenforced("not", "/properties/tags/items/not"),
        Unenforced("format: hostname", "/properties/a~1b/anyOf/0/format"),
        Unenforced("uniqueItems", "/$defs/x/uniqueItems"),
    ]
    assert str(unenforced(schema, REFUSED)[0]) == "'uniqueItems' at #/properties/tags/uniqueItems"


def test_known_formats_and_bounds_pass_and_a_format_beside_a_pattern_does_not() -> None:
    assert unenforced({"type": "integer", "minimum": 1, "multipleOf": 2}, REFUSED) == []
    assert unenforced({"type": "string", "format": "date"}, REFUSED) == []
    assert unenforced({"type": "string", "format": "date", "pattern": "^2"}, REFUSED) == [
        Unenforced("format: date beside a pattern", "/format")
    ]


def test_formats_become_patterns_and_objects_close_without_touching_the_argument() -> None:
    schema = {
        "type": "object",
        "properties": {"d": {"type": "string", "format": "date"}},
        "items": {"type": "object", "properties": {}, "additionalProperties": True},
    }
    out = with_format_patterns(schema)
    assert out["properties"]["d"] == {"type": "string", "pattern": FORMAT_PATTERNS["date"]}
    assert out["additionalProperties"] is False
    assert out["items"]["additionalProperties"] is True  # said: kept
    assert "format" in schema["properties"]["d"] and "additionalProperties" not in schema


def test_the_date_pattern_matches_exactly_the_calendars_dates() -> None:
    date = re.compile(FORMAT_PATTERNS["date"])
    for year in (1, 4, 100, 400, 1900, 2000, 2023, 2024, 9999):
        for month in range(1, 13):
            for day in range(1, 32):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    datetime.date(year, month, day)
                    valid = True
                except ValueError:
                    valid = False
                assert bool(date.match(text)) == valid, text
    assert not date.match("0000-01-01")


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("time", ["00:00:00Z", "23:59:59.123456+05:30"], ["24:00:00Z", "10:60:00Z", "10:00:60Z", "10:00:00"]),
        ("date-time", ["2024-02-29T12:00:00Z"], ["2023-02-29T12:00:00Z", "2024-02-29t12:00:00z"]),
        ("uuid", ["123e4567-e89b-42d3-a456-426614174000"], ["123e4567-e89b-02d3-a456-426614174000", "x"]),
        ("email", ["a.b@example.org"], ["@example.org", "a@b", "a b@example.org"]),
    ],
)
def test_each_format_pattern_takes_valid_values_only(fmt: str, good: list[str], bad: list[str]) -> None:
    pattern = re.compile(FORMAT_PATTERNS[fmt])
    assert all(pattern.match(text) for text in good)
    assert not any(pattern.match(text) for text in bad)
    if fmt in ("time", "date-time"):
        parse = datetime.time.fromisoformat if fmt == "time" else datetime.datetime.fromisoformat
        for text in good:
            parse(text)
