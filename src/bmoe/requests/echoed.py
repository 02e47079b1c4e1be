"""Checks for what a reply echoes back of its request, made before the request is taken.

A reply is JSON, and Python's JSON reader takes ``1e999`` as infinity, which JSON cannot
write: a request field echoed unchecked would fail the reply after the work was done (a 500
where the client sent a bad field). So each echoed field is checked as it is read, and a
refusal is a ``RequestError`` naming the field:

- ``metadata`` as OpenAI checks it: an object of at most 16 keys, each a string of at most
  64 characters, each value a string of at most 512 characters;
- a JSON value echoed whole (a tool's parameters, a text format's schema): every number in
  it finite (``finite_json``).
"""

from __future__ import annotations

import math

from bmoe.adapters.protocol.checks import json_type_name
from bmoe.errors import RequestError
from bmoe.requests.fields import Body

METADATA_KEYS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


def metadata(body: Body, name: str = "metadata") -> dict[str, str]:
    """``body[name]`` as OpenAI's ``metadata`` (``{}`` when absent or null)."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'{name}' must be an object of strings, got {json_type_name(value)}", name)
    if len(value) > METADATA_KEYS:
        raise RequestError(f"'{name}' holds at most {METADATA_KEYS} keys, got {len(value)}", name)
    for key, item in value.items():
        where = f"{name}.{key}"
        if len(key) > METADATA_KEY_CHARS:
            raise RequestError(
                f"{where}: a metadata key is at most {METADATA_KEY_CHARS} characters, got {len(key)}", where
            )
        if not isinstance(item, str):
            raise RequestError(
                f"{where}: a metadata value must be a string, got {json_type_name(item)}", where
            )
        if len(item) > METADATA_VALUE_CHARS:
            raise RequestError(
                f"{where}: a metadata value is at most {METADATA_VALUE_CHARS} characters, got {len(item)}",
                where,
            )
    return dict(value)


def finite_json(value: object, where: str) -> None:
    """Refuse ``value`` (a parsed JSON value, at ``where``) if a number in it is not finite
    (``1e999`` read as infinity): it could not be written back."""
    stack: list[tuple[object, str]] = [(value, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise RequestError(f"{at}: the number is out of range (JSON numbers must be finite)", at)
        if isinstance(node, dict):
            stack.extend((v, f"{at}.{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(node))
