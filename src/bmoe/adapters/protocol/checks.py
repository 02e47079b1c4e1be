"""Strict JSON type checks shared by the request and response classes and the converter.

JSON has one number type, Python three (``bool`` is an ``int``): the protocol keeps them
apart. ``true`` is not an integer, ``1`` is not a boolean, and ``2.0`` is not an integer.
Every check here raises ``FieldTypeError`` (a ``TypeError``) that knows what was expected
and what came, in JSON's words, so the converter can name the field in one line.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from typing import Any, SupportsFloat, SupportsIndex, TypeAlias, TypeVar

import attrs

RequestId: TypeAlias = str | int | None
"""A request's ``id``: whatever string or integer the client sent, ``None`` when absent."""

T = TypeVar("T")


def json_type_name(value: object) -> str:
    """What ``value`` is, in JSON's words (``float`` for a number with a fraction or exponent)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class FieldTypeError(TypeError):
    """A value of the wrong JSON type: ``must be {expected}, got {got}``."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"must be {expected}, got {got}")
        self.expected = expected
        self.got = got


def check_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise FieldTypeError("an integer", json_type_name(value))


def check_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise FieldTypeError("a boolean", json_type_name(value))


def check_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise FieldTypeError("a string", json_type_name(value))


def check_id(value: object) -> RequestId:
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise FieldTypeError("a string or an integer", json_type_name(value))


def check_number(value: object) -> float:
    """An integer or a float, as a float; ``null`` (how the writer spells a non-finite
    float) reads back as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise FieldTypeError("a number", "an integer too large for a float") from None
    raise FieldTypeError("a number", json_type_name(value))


def check_str_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise FieldTypeError("a list of strings", json_type_name(value))
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise FieldTypeError("a list of strings", f"{json_type_name(item)} at index {i}")
    return tuple(value)


def check_number_list(value: object) -> tuple[float | None, ...]:
    """A list of numbers or nulls; ``null`` stays ``None`` (a log-probability of -inf)."""
    if not isinstance(value, list | tuple):
        raise FieldTypeError("a list of numbers", json_type_name(value))
    out: list[float | None] = []
    for i, item in enumerate(value):
        if item is None:
            out.append(None)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            out.append(check_number(item))
        else:
            raise FieldTypeError("a list of numbers", f"{json_type_name(item)} at index {i}")
    return tuple(out)


def optional(check: Callable[[object], T]) -> Callable[[object], T | None]:
    """``check``, letting ``None`` (JSON ``null``, or the field left out) through."""

    def check_optional(value: object) -> T | None:
        return None if value is None else check(value)

    return check_optional


def typed(check: Callable[[object], Any]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator running ``check``; the error names the field:
    ``field "n_predict" must be an integer, got boolean``."""

    def validate(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        try:
            check(value)
        except FieldTypeError as exc:
            raise TypeError(f'field "{attribute.name}" {exc}') from None

    return validate


# Converters for the response classes: the engine may hand numpy scalars or ints where the
# protocol has floats; they become plain Python numbers, so the writer can serialise them.


def as_float(value: SupportsFloat) -> float:
    if isinstance(value, bool) or not hasattr(type(value), "__float__") or isinstance(value, str | bytes):
        raise FieldTypeError("a number", json_type_name(value))
    return float(value)


def as_int(value: SupportsIndex) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise FieldTypeError("an integer", json_type_name(value))
    return operator.index(value)


def as_float_or_none_tuple(values: Iterable[SupportsFloat | None]) -> tuple[float | None, ...]:
    if isinstance(values, str | bytes):
        raise FieldTypeError("a list of numbers", json_type_name(values))
    return tuple(None if v is None else as_float(v) for v in values)
