"""The agent-facing fields of a request: tools, the tool choice, tool messages, response
formats, log-probabilities and the sampling knobs OpenAI names (penalties, ``logit_bias``).

Readers from a JSON body to bmoe's domain values, each failure a ``RequestError`` naming the
field, as the rest of ``api_requests``. What the values mean is in ``docs/server.md``.
"""

from __future__ import annotations

from typing import Any

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TOP_LOGPROBS_MAX
from bmoe.domain.tools import ToolCall, ToolUse
from bmoe.domain.tools.openai_json import ToolSpecError, read_tool_calls, read_tool_use
from bmoe.errors import RequestError
from bmoe.requests.fields import Body, opt_bool, opt_int, opt_number, opt_object, opt_str


def tool_use(body: Body) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (``None``: no tools offered)."""
    try:
        return read_tool_use(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    except ToolSpecError as exc:
        raise RequestError(str(exc), exc.where) from None


def tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``."""
    try:
        return read_tool_calls(value, where)
    except ToolSpecError as exc:
        raise RequestError(str(exc), exc.where) from None


def response_constraint(body: Body) -> OutputConstraint | None:
    """``response_format`` (``text``, ``json_object``, ``json_schema``) or the ``grammar``
    extension (GBNF, llama.cpp server's name); not both."""
    fmt = opt_object(body, "response_format")
    grammar = opt_str(body, "grammar")
    constraint = None
    if fmt is not None:
        kind = fmt.get("type")
        if kind == "json_object":
            constraint = OutputConstraint("json_object")
        elif kind == "json_schema":
            spec = opt_object(fmt, "json_schema")
            schema = opt_object(spec, "schema") if spec is not None else None
            if schema is None:
                raise RequestError(
                    'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                    "response_format",
                )
            constraint = OutputConstraint.json_schema(schema)
        elif kind != "text":
            raise RequestError(
                "response_format.type must be 'text', 'json_object' or 'json_schema'", "response_format"
            )
    if grammar:
        if constraint is not None:
            raise RequestError("give 'grammar' or 'response_format', not both", "grammar")
        constraint = OutputConstraint.gbnf(grammar)
    return constraint


def chat_logprobs(body: Body) -> int | None:
    """``logprobs`` (bool) and ``top_logprobs`` (0 to 20, only with ``logprobs``)."""
    wanted = opt_bool(body, "logprobs")
    top = opt_int(body, "top_logprobs", low=0, high=TOP_LOGPROBS_MAX)
    if top is not None and top > 0 and not wanted:
        raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def completion_logprobs(body: Body) -> int | None:
    """A text completion's ``logprobs``: how many alternatives (0 to 20) per token."""
    return opt_int(body, "logprobs", low=0, high=TOP_LOGPROBS_MAX)


def penalties_and_bias(body: Body) -> dict[str, Any]:
    """``frequency_penalty``, ``presence_penalty`` (-2 to 2) and ``logit_bias`` (token id
    to -100..100), as ``SamplingParams`` fields; absent or neutral ones are left out."""
    out: dict[str, Any] = {}
    for name in ("frequency_penalty", "presence_penalty"):
        value = opt_number(body, name, low=-2.0, high=2.0)
        if value:  # 0 is off: no sampler is added
            out[name] = value
    bias = opt_object(body, "logit_bias")
    if bias:
        pairs = []
        for key, given in bias.items():
            if not key.isdigit():
                raise RequestError(f"logit_bias keys are token ids, got {key!r}", "logit_bias")
            if not isinstance(given, int | float) or isinstance(given, bool) or not -100 <= given <= 100:
                raise RequestError(f"logit_bias[{key}] must be a number in [-100, 100]", "logit_bias")
            pairs.append((int(key), float(given)))
        out["logit_bias"] = tuple(pairs)
    return out
