"""The one place JSON values become protocol events and back (cattrs).

Two converters, because the two directions trust different sides:

- requests (from a client): strict. Unknown keys are refused, types are JSON's and kept apart
  (``true`` is not an integer, ``1`` is not a boolean, ``2.0`` is not an integer), and every
  problem becomes one readable phrase (``field "n_predict" must be an integer, got string``).
- responses (from an engine, read by a client): forward compatible. Unknown keys are ignored,
  an integer is accepted where a float is expected, and ``null`` in a float field reads back
  as NaN (in ``choice_logp``: as ``None``).

The writer's direction (event -> dict) writes a non-finite float as ``None``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from bmoe.adapters.protocol.checks import (
    FieldTypeError,
    RequestId,
    check_bool,
    check_id,
    check_int,
    check_number,
    check_number_list,
    check_str,
    check_str_list,
    json_type_name,
    optional,
)
from bmoe.adapters.protocol.errors import ProtocolError
from bmoe.adapters.protocol.requests import REQUEST_TYPES, BadRequest, Request
from bmoe.adapters.protocol.responses import RESPONSE_TYPES, Response
from bmoe.errors import ConfigError

_CMDS = ", ".join(sorted(REQUEST_TYPES))


def _hook(check: Callable[[object], Any]) -> Callable[[object, Any], Any]:
    return lambda value, _type: check(value)


def _register_strict_hooks(converter: cattrs.Converter) -> None:
    # Classes go through cattrs' single dispatch; unions and generic aliases must be matched
    # by equality (single dispatch would split a union and register each member).
    converter.register_structure_hook(str, _hook(check_str))
    converter.register_structure_hook(int, _hook(check_int))
    converter.register_structure_hook(bool, _hook(check_bool))
    converter.register_structure_hook(float, _hook(check_number))
    exact: list[tuple[Any, Callable[[object], Any]]] = [
        (int | None, optional(check_int)),
        (bool | None, optional(check_bool)),
        (RequestId, check_id),
        (tuple[str, ...], check_str_list),
        (tuple[float | None, ...], check_number_list),
    ]
    for type_, check in exact:
        converter.register_structure_hook_func(_equals(type_), _hook(check))


def _equals(type_: Any) -> Callable[[Any], bool]:
    return lambda other: bool(other == type_)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _make_request_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    _register_strict_hooks(converter)
    return converter


def _make_response_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=False, detailed_validation=True)
    _register_strict_hooks(converter)
    converter.register_unstructure_hook(float, _finite_or_none)
    converter.register_unstructure_hook_func(
        _equals(tuple[float | None, ...]),
        lambda values: [None if v is None else _finite_or_none(v) for v in values],
    )
    return converter


REQUEST_CONVERTER = _make_request_converter()
RESPONSE_CONVERTER = _make_response_converter()


def _problems(exc: BaseException, where: str) -> list[str]:
    """One phrase per problem that cattrs collected while structuring a class."""
    if not isinstance(exc, ClassValidationError):
        return [_phrase(exc, None, where)]
    with_notes, without = exc.group_exceptions()
    out = [_phrase(sub, note.name, where) for sub, note in with_notes]
    out += [_phrase(sub, None, where) for sub in without]
    return out


def _phrase(exc: BaseException, field: str | None, where: str) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        return "; ".join(f"unknown field {_quoted(key)} in {where}" for key in sorted(exc.extra_fields))
    if field is None:
        return str(exc)
    if isinstance(exc, KeyError):
        return f'missing field "{field}" in {where}'
    if isinstance(exc, FieldTypeError):
        return f'field "{field}" {exc}'
    return f'field "{field}": {exc}'


def _quoted(text: str, limit: int = 40) -> str:
    """``text`` in double quotes as JSON writes it (so a newline in it stays ``\\n``), cut
    after ``limit`` characters: a client's key can be anything, the message stays one line."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return json.dumps(cut, ensure_ascii=False)


def request_from_json(obj: object) -> Request | BadRequest:
    """A parsed JSON line as a request, or as a ``BadRequest`` naming every problem found."""
    if not isinstance(obj, dict):
        return BadRequest(None, "a request must be a JSON object")
    try:
        request_id = check_id(obj.get("id"))
    except FieldTypeError:
        request_id = None
    if "cmd" not in obj:
        return BadRequest(request_id, 'missing "cmd"')
    cmd = obj["cmd"]
    if not isinstance(cmd, str):
        return BadRequest(request_id, f'field "cmd" must be a string, got {json_type_name(cmd)}')
    cls = REQUEST_TYPES.get(cmd)
    if cls is None:
        return BadRequest(request_id, f"unknown cmd {_quoted(cmd)} (expected one of: {_CMDS})")
    fields = {key: value for key, value in obj.items() if key != "cmd"}
    try:
        return REQUEST_CONVERTER.structure(fields, cls)
    except (ClassValidationError, ConfigError, TypeError) as exc:
        return BadRequest(request_id, "; ".join(_problems(exc, cmd)))


def response_to_json(event: Response) -> dict[str, Any]:
    """An event as a JSON-ready dict, keys in the protocol's order, non-finite floats ``None``."""
    out: dict[str, Any] = RESPONSE_CONVERTER.unstructure(event)
    return out


def response_from_json(tag: str, obj: object) -> Response:
    """A parsed ``BMOE_*`` line back into its event; keys this version does not know are
    ignored. Raises ``ProtocolError`` (naming the problems, not the line) for an unknown tag
    or a missing or mistyped field."""
    cls = RESPONSE_TYPES.get(tag)
    if cls is None:
        raise ProtocolError(f'unknown tag "{tag}" (expected one of: {", ".join(RESPONSE_TYPES)})')
    if not isinstance(obj, dict):
        raise ProtocolError(f"{tag} must carry a JSON object, got {json_type_name(obj)}")
    try:
        return RESPONSE_CONVERTER.structure(obj, cls)
    except (ClassValidationError, ValueError, TypeError) as exc:
        raise ProtocolError("; ".join(_problems(exc, tag))) from exc
