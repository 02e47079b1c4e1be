"""Strict readers of a JSON request body's fields.

JSON has one number type and Python three (``bool`` is an ``int``); these keep them apart as
the line protocol does: ``true`` is not an integer and ``1.5`` is not one either, but an
integer is a number. ``null`` reads as absent. Every failure is a ``RequestError`` naming
the field (``param``), so the client is told which one is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from bmoe.adapters.protocol.checks import json_type_name
from bmoe.errors import RequestError

Body = Mapping[str, object]


def body_object(value: object) -> Body:
    """The request body: a JSON object."""
    if not isinstance(value, dict):
        raise RequestError(f"the request body must be a JSON object, got {json_type_name(value)}")
    return value


def _wrong(name: str, expected: str, value: object) -> RequestError:
    return RequestError(f"'{name}' must be {expected}, got {json_type_name(value)}", name)


def opt_int(body: Body, name: str, *, low: int | None = None, high: int | None = None) -> int | None:
    """An integer in ``[low, high]``, or ``None`` when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong(name, "an integer", value)
    if high is None and low is not None and value < low:
        raise RequestError(f"'{name}' must be >= {low}, got {value}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise RequestError(f"'{name}' must be in [{low}, {high}], got {value}", name)
    return value


def opt_number(body: Body, name: str, *, low: float, high: float) -> float | None:
    """A finite number in ``[low, high]``, or ``None`` when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _wrong(name, "a number", value)
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise RequestError(f"'{name}' must be in [{low:g}, {high:g}], got {value}", name)
    return number


def opt_bool(body: Body, name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _wrong(name, "a boolean", value)
    return value


def opt_str(body: Body, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong(name, "a string", value)
    return value


def opt_object(body: Body, name: str) -> Body | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _wrong(name, "an object", value)
    return value


def stop_strings(body: Body, name: str = "stop", *, most: int = 4) -> tuple[str, ...]:
    """OpenAI's ``stop``: a string or a list of at most ``most`` strings, none empty."""
    value = body.get(name)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _wrong(name, "a string or a list of strings", value)
    if len(items) > most:
        raise RequestError(f"'{name}' takes at most {most} strings, got {len(items)}", name)
    if any(not s for s in items):
        raise RequestError(f"'{name}' strings must not be empty", name)
    return tuple(items)


def refuse_unless(body: Body, name: str, *allowed: object) -> None:
    """Refuse ``name`` (``unsupported_parameter``) unless it is absent, null or one of ``allowed``."""
    value = body.get(name)
    if value is None or any(value == ok and type(value) is type(ok) for ok in allowed):
        return
    raise RequestError(f"'{name}' is not supported by this server", name, "unsupported_parameter")
