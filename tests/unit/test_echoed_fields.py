"""What a reply echoes back is checked before the request is taken: Responses ``metadata``
as OpenAI checks it, and no number JSON cannot write (``1e999`` reads as infinity) in a
field echoed whole, each refused by the field's name (a 400, not a 500 when the reply is
written)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bmoe.errors import RequestError
from bmoe.requests.echoed import finite_json, metadata
from bmoe.serve.responses_requests import parse_responses

INF = json.loads("1e999")


def refused(body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse_responses({"input": "hi", **body})
    return caught.value


def test_metadata_is_echoed_as_sent_when_it_is_strings_within_bounds() -> None:
    sent = {f"k{i}": "v" * 512 for i in range(15)} | {"k" * 64: ""}
    asked = parse_responses({"input": "hi", "metadata": sent})
    assert asked.echo["metadata"] == sent
    assert parse_responses({"input": "hi"}).echo["metadata"] == {}
    assert parse_responses({"input": "hi", "metadata": None}).echo["metadata"] == {}


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ({"a": INF}, "metadata.a", "must be a string"),
        ({"a": 1}, "metadata.a", "must be a string"),
        ({"a": {"b": "c"}}, "metadata.a", "must be a string"),
        ({"a": "v" * 513}, "metadata.a", "at most 512 characters"),
        ({"k" * 65: "v"}, "metadata." + "k" * 65, "at most 64 characters"),
        ({f"k{i}": "v" for i in range(17)}, "metadata", "at most 16 keys"),
        ("text", "metadata", "must be an object"),
        ([], "metadata", "must be an object"),
    ],
)
def test_metadata_out_of_openais_bounds_is_refused_by_name(value: Any, param: str, words: str) -> None:
    error = refused({"metadata": value})
    assert error.param == param
    assert words in str(error)
    assert str(error).startswith(param) or f"'{param}'" in str(error)


def test_the_issues_body_is_a_400_naming_the_field() -> None:
    with pytest.raises(RequestError) as caught:
        parse_responses(json.loads('{"input":"hi","metadata":{"a":1e999}}'))
    assert caught.value.param == "metadata.a"


def test_a_tools_parameters_echoed_whole_hold_only_finite_numbers() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "number", "maximum": INF}}}
    error = refused({"tools": [{"type": "function", "name": "f", "parameters": schema}]})
    assert error.param == "tools[0].parameters.properties.a.maximum"
    ok = parse_responses(
        {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"maximum": 1e308}}]}
    )
    json.dumps(ok.echo, allow_nan=False)  # the reply can be written


def test_a_text_formats_schema_and_fields_echoed_whole_hold_only_finite_numbers() -> None:
    schema = {"type": "array", "items": {"enum": [1, INF]}}
    error = refused({"text": {"format": {"type": "json_schema", "name": "r", "schema": schema}}})
    assert error.param == "text.format.schema.items.enum[1]"
    assert refused({"text": {"format": {"type": "text", "x": [INF]}}}).param == "text.format.x[0]"


def test_every_echoed_field_of_an_accepted_request_can_be_written_back() -> None:
    """The reply's echo of a request with every echoed field set is JSON as written (no
    infinity) and holds what was sent."""
    body = {
        "input": "hi",
        "instructions": "Be brief.",
        "metadata": {"a": "b"},
        "max_output_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"maximum": 1.5e308}}},
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
    }
    echo = parse_responses(body).echo
    written = json.loads(json.dumps(echo, allow_nan=False))
    assert written["metadata"] == {"a": "b"} and written["instructions"] == "Be brief."
    assert written["text"]["format"]["schema"] == {"maximum": 1.5e308}
    assert written["tools"][0]["name"] == "f" and written["tool_choice"] == {"type": "function", "name": "f"}


def test_finite_json_names_the_first_infinite_number_and_passes_the_rest() -> None:
    finite_json({"a": [1, 2.5, {"b": None, "c": "x", "d": True}]}, "v")
    with pytest.raises(RequestError) as caught:
        finite_json({"a": [1, {"b": -INF}]}, "v")
    assert caught.value.param == "v.a[1].b"
    with pytest.raises(RequestError):
        finite_json(float("nan"), "v")
    assert metadata({}) == {}
