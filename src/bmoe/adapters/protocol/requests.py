"""What a client asks for, and what the request reader yields.

One frozen, slotted class per ``cmd`` of docs/protocol.md. Each validates when built, so a
request that exists is one the session can act on as far as the protocol can tell; the
refusals that need a tokenizer (colliding first tokens, a prompt past the context) belong
to the engine. Wrong values raise ``bmoe.errors.ConfigError`` with the message the session
sends back; wrong types raise ``TypeError``. From a line, the reader never raises: it yields
``BadRequest`` instead.

Arguments are keyword-only. ``id`` is the client's string or integer, echoed on every
response to the request, ``None`` when the client sent none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeAlias

import attrs

from bmoe.adapters.protocol.checks import (
    FieldTypeError,
    RequestId,
    check_bool,
    check_id,
    check_int,
    check_str,
    check_str_list,
    optional,
    typed,
)
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TOP_LOGPROBS_MAX
from bmoe.domain.tools import ToolUse
from bmoe.domain.tools.openai_json import read_tool_use
from bmoe.errors import ConfigError


def _non_negative(_inst: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 0:
        raise ConfigError(f'field "{attribute.name}" must be >= 0, got {value}')


def _choices_tuple(value: Sequence[str]) -> tuple[str, ...]:
    """A list or tuple of strings, as a tuple (the class is frozen, so hashable)."""
    try:
        return check_str_list(value)
    except FieldTypeError as exc:
        raise TypeError(f'field "choices" {exc}') from None


def _images_tuple(value: Sequence[str]) -> tuple[str, ...]:
    """``images``: the pictures the prompt places (``<__media__>``), each a data: URI or
    base64 (as a tuple: the class is frozen)."""
    try:
        return check_str_list(value)
    except FieldTypeError as exc:
        raise TypeError(f'field "images" {exc}') from None


@attrs.frozen(kw_only=True)
class GenerateCmd:
    """``{"cmd":"generate"}``: complete a prompt.

    - ``prompt``: the text, never empty (a user message in chat mode, rendered by the engine).
    - ``n_predict``: most tokens to generate, >= 0; ``None``: the session's default.
    - ``think``: render with thinking on or off; ``None``: the session's setting.
    - ``clear_kv``: ``True`` (default) starts a new chat, ``False`` continues the one the
      engine holds, reusing the KV prefix.
    - ``grammar`` (GBNF) or ``json_schema`` (an object): what the reply must follow.
    - ``tools``, ``tool_choice``, ``parallel_tool_calls``: OpenAI's shapes (chat mode); the
      calls the reply makes come back in ``BMOE_DONE``'s ``tool_calls``.
    - ``logprobs``: report each token's log-probability and that many alternatives (0-20)
      in ``BMOE_DONE``'s ``logprobs``.
    - ``conversation``: the name of the conversation it continues (absent: the default
      one); the session keeps each named conversation's history, and with a prompt cache
      (``--cache-ram``) its state.
    """

    CMD: ClassVar[str] = "generate"

    id: RequestId = attrs.field(default=None, validator=typed(check_id))
    prompt: str = attrs.field(validator=typed(check_str))
    n_predict: int | None = attrs.field(default=None, validator=[typed(optional(check_int)), _non_negative])
    think: bool | None = attrs.field(default=None, validator=typed(optional(check_bool)))
    clear_kv: bool = attrs.field(default=True, validator=typed(check_bool))
    grammar: str | None = attrs.field(default=None, validator=typed(optional(check_str)))
    json_schema: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = attrs.field(default=None, validator=typed(optional(check_bool)))
    logprobs: int | None = attrs.field(default=None, validator=typed(optional(check_int)))
    conversation: str | None = attrs.field(default=None, validator=typed(optional(check_str)))
    images: tuple[str, ...] = attrs.field(default=(), converter=_images_tuple)

    @prompt.validator
    def _prompt_not_empty(self, _attribute: attrs.Attribute[str], value: str) -> None:
        if not value:
            raise ConfigError("empty prompt")

    def __attrs_post_init__(self) -> None:
        if self.logprobs is not None and not 0 <= self.logprobs <= TOP_LOGPROBS_MAX:
            raise ConfigError(f'field "logprobs" must be in [0, {TOP_LOGPROBS_MAX}], got {self.logprobs}')
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ConfigError('field "json_schema" must be an object')
        if self.grammar and self.json_schema is not None:
            raise ConfigError('give "grammar" or "json_schema", not both')
        self.tool_use()  # a wrong shape is refused now, naming the field

    def constraint(self) -> OutputConstraint | None:
        if self.grammar:
            return OutputConstraint.gbnf(self.grammar)
        if self.json_schema is None:
            return None
        return attrs.evolve(OutputConstraint.json_schema(self.json_schema), field="json_schema")

    def tool_use(self) -> ToolUse | None:
        return read_tool_use(self.tools, self.tool_choice, self.parallel_tool_calls)


@attrs.frozen(kw_only=True)
class DecideCmd:
    """``{"cmd":"decide"}``: which of ``choices`` would the model answer (spec/decide.md).

    - ``prefix``, ``suffix``: the prompt in two parts, rendered as one user message; the
      prefix is the part worth keeping state for. Either may be empty (the default), not both.
    - ``choices``: one or more non-empty strings, scored by their first token.
    - ``reuse_prefix``: ``False`` prefills this request whole and leaves the kept state alone.
    """

    CMD: ClassVar[str] = "decide"

    id: RequestId = attrs.field(default=None, validator=typed(check_id))
    prefix: str = attrs.field(default="", validator=typed(check_str))
    suffix: str = attrs.field(default="", validator=typed(check_str))
    choices: tuple[str, ...] = attrs.field(converter=_choices_tuple)
    reuse_prefix: bool = attrs.field(default=True, validator=typed(check_bool))
    images: tuple[str, ...] = attrs.field(default=(), converter=_images_tuple)

    @choices.validator
    def _choices_not_empty(self, _attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
        if not value:
            raise ConfigError("empty choices list")
        for i, choice in enumerate(value):
            if not choice:
                raise ConfigError(f"empty choice at index {i}")

    def __attrs_post_init__(self) -> None:
        if not self.prefix and not self.suffix:
            raise ConfigError("empty prompt: prefix and suffix are both empty")


@attrs.frozen(kw_only=True)
class CancelCmd:
    """``{"cmd":"cancel"}``: stop the request in flight at the next decode boundary; ignored
    when none runs. With an ``id``: the request with that id, in flight or queued (it then
    ends cancelled as soon as it begins); nothing for an id finished or unknown."""

    CMD: ClassVar[str] = "cancel"

    id: RequestId = attrs.field(default=None, validator=typed(check_id))


@attrs.frozen(kw_only=True)
class CloseCmd:
    """``{"cmd":"close"}``: end the session (end of input does the same). An ``id`` is
    accepted and ignored, so a client that tags every line is not refused."""

    CMD: ClassVar[str] = "close"

    id: RequestId = attrs.field(default=None, validator=typed(check_id))


Request: TypeAlias = GenerateCmd | DecideCmd | CancelCmd | CloseCmd
"""Any request the session can act on."""

REQUEST_TYPES: dict[str, type[Request]] = {
    cls.CMD: cls for cls in (CancelCmd, CloseCmd, DecideCmd, GenerateCmd)
}
"""``cmd`` -> request class, in alphabetical order of ``cmd``."""


@attrs.frozen
class BadRequest:
    """A line that is not a request the session can act on. Answer it with
    ``Error(id=..., fatal=False, msg=...)`` and go on with the next line.

    ``id`` is the line's ``id`` when the line was a JSON object with a valid one, else
    ``None``; ``msg`` names the problem in one line, e.g. ``missing field "prompt" in generate``.
    """

    id: RequestId
    msg: str


@attrs.frozen
class EndOfInput:
    """The input ended (after every event of its last line): the session closes, as on
    ``close``."""


ReaderEvent: TypeAlias = Request | BadRequest | EndOfInput
"""What ``RequestReader.feed`` and ``feed_eof`` yield."""
