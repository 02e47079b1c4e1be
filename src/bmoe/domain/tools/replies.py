"""Reading tool calls back out of a model's reply, whole or as it streams.

``parse_reply`` splits a finished reply into its text and the calls it wrote, in the
family's syntax (``formats``). A call whose JSON does not parse, or that names no function,
is not a call: its text stays in the content, as llama.cpp's server does. ``ReplyGate``
lets a streamed reply's text out up to the first place a call could begin, holds the rest,
and parses it when the reply ends, so streamed and whole replies read the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import attrs

from bmoe.domain.tools.formats import MARKER, ToolFormat
from bmoe.domain.tools.values import ToolCall, new_call_id

NewId = Callable[[], str]


@attrs.frozen
class ToolReply:
    """A reply read for calls: its ``content`` (the text outside the calls), ``reasoning``
    found in the family's own channels (gpt-oss's ``analysis``) and the ``calls``."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""


_DECODER = json.JSONDecoder()


def _json_at(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``text[at:]`` (after blanks) and where it ends."""
    while at < len(text) and text[at].isspace():
        at += 1
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        return None


def _arguments(value: Any, raw: str | None = None) -> str | None:
    """OpenAI's arguments text: an object as the model wrote it (``raw``, its JSON text) or,
    without it, as compact JSON; a string that is JSON, as is."""
    if isinstance(value, dict):
        return raw if raw is not None else json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return value if isinstance(parsed, dict) else None
    return None


_ARGS_KEY = {key: re.compile(rf'"{key}"\s*:\s*') for key in ("arguments", "parameters")}


def _raw_value(source: str, key: str, value: Any) -> str | None:
    """The text ``source`` (a call object's JSON) gives for its ``key``, when it is ``value``:
    the first ``"key":`` in the text is the call's own (its name holds no such text)."""
    found = _ARGS_KEY[key].search(source)
    if found is None:
        return None
    try:
        parsed, end = _DECODER.raw_decode(source, found.end())
    except ValueError:
        return None
    return source[found.end() : end] if parsed == value else None


def _call(obj: Any, new_id: NewId, args_key: str = "arguments", source: str | None = None) -> ToolCall | None:
    """A call from its parsed object; ``source``: the object's text, whose arguments are
    kept as written (so that arguments streamed as written end as the reply's)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = args_key if args_key in obj else "arguments"
    value = obj.get(key, {})
    raw = _raw_value(source, key, value) if source is not None and key in obj else None
    args = _arguments(value, raw)
    return None if args is None else ToolCall(new_id(), obj["name"], args)


def _hermes(text: str, new_id: NewId) -> ToolReply:
    calls: list[ToolCall] = []
    kept: list[str] = []
    at = 0
    for match in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|\Z)", text, re.DOTALL):
        body = match.group(1)
        found = _json_at(body, 0)
        call = (
            _call(found[0], new_id, source=body)
            if found is not None and not body[found[1] :].strip()
            else None
        )
        if call is None:
            continue
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(call)
    kept.append(text[at:])
    return ToolReply(_joined(kept), tuple(calls))


def _json_items(text: str, at: int) -> tuple[list[tuple[Any, str]], int] | None:
    """The JSON array (or single object) at ``text[at:]``, item by item with each item's
    text, and where it ends."""
    found = _json_at(text, at)
    if found is None:
        return None
    value, end = found
    if not isinstance(value, list):
        return [(value, text[at:end])], end
    items = []
    pos = text.index("[", at) + 1
    for item in value:
        while text[pos] in " \t\r\n,":
            pos += 1
        _, item_end = _DECODER.raw_decode(text, pos)
        items.append((item, text[pos:item_end]))
        pos = item_end
    return items, end


def _mistral(text: str, new_id: NewId) -> ToolReply:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return ToolReply(text)
    found = _json_items(text, start + len("[TOOL_CALLS]"))
    if found is None:
        return ToolReply(text)
    items, end = found
    calls = [_call(item, new_id, source=source) for item, source in items]
    if not calls or any(c is None for c in calls):
        return ToolReply(text)
    return ToolReply(_joined([text[:start], text[end:]]), tuple(c for c in calls if c is not None))


def _mistral_args(text: str, new_id: NewId) -> ToolReply:
    head, *parts = text.split("[TOOL_CALLS]")
    calls: list[ToolCall] = []
    rest: list[str] = [head]
    for part in parts:
        name, sep, body = part.partition("[ARGS]")
        found = _json_at(body, 0) if sep else None
        raw = body[len(body) - len(body.lstrip()) : found[1]] if found is not None else None
        args = _arguments(found[0], raw) if found is not None else None
        if not name.strip() or args is None:
            rest.append("[TOOL_CALLS]" + part)
            continue
        calls.append(ToolCall(new_id(), name.strip(), args))
        rest.append(body[found[1] :] if found is not None else "")
    return ToolReply(_joined(rest), tuple(calls))


def _llama3(text: str, new_id: NewId) -> ToolReply:
    body = text.lstrip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :]
    found = _json_at(body, 0)
    call = _call(found[0], new_id, "parameters", source=body[: found[1]]) if found is not None else None
    if call is None or body[found[1] :].strip():  # type: ignore[index]
        return ToolReply(text)
    return ToolReply("", (call,))


_HARMONY_MESSAGE = re.compile(
    r"<\|channel\|>(?P<channel>\w+)(?P<header>[^<]*)(?:<\|constrain\|>\w+)?<\|message\|>"
    r"(?P<body>.*?)(?=<\|end\|>|<\|call\|>|<\|return\|>|<\|start\|>|\Z)",
    re.DOTALL,
)


def _harmony(text: str, new_id: NewId) -> ToolReply:
    """gpt-oss's messages: ``analysis`` is reasoning, ``final`` the content, a
    ``commentary`` addressed ``to=functions.NAME`` a call. Text with no channel is content."""
    if "<|channel|>" not in text:
        return ToolReply(text)
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for match in _HARMONY_MESSAGE.finditer(text):
        channel, header, body = match.group("channel"), match.group("header"), match.group("body")
        to = re.search(r"to=functions\.([\w.-]+)", header)
        if to is not None:
            args = _arguments(body.strip())
            if args is not None:
                calls.append(ToolCall(new_id(), to.group(1), args))
                continue
        (reasoning if channel == "analysis" else content).append(body)
    return ToolReply("".join(content), tuple(calls), "".join(reasoning))


def _joined(parts: list[str]) -> str:
    """The text left around removed calls: the text before the first as it was, what
    follows each call without the blank line that separated it."""
    head, *tails = parts
    return head + "".join(t.lstrip() for t in tails) if tails else head


_PARSERS: dict[ToolFormat, Callable[[str, NewId], ToolReply]] = {
    ToolFormat.HERMES: _hermes,
    ToolFormat.GENERIC: _hermes,
    ToolFormat.MISTRAL: _mistral,
    ToolFormat.MISTRAL_ARGS: _mistral_args,
    ToolFormat.LLAMA3: _llama3,
    ToolFormat.HARMONY: _harmony,
}


CALL_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
"""A call object's name as far as it is written (group 2: its closing quote, once there)."""
CALL_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
"""Where a call object's arguments begin."""
_HARMONY_CUT = re.compile(r"to=functions\.([\w.-]*)(?:[^<]*(?:<\|constrain\|>\w*)?<\|message\|>)?")


def unquoted(name: str) -> str:
    """A JSON string's inside (``CALL_NAME``'s group 1) as text, escapes undone."""
    try:
        return str(json.loads(f'"{name}"'))
    except ValueError:
        return name


def _cut_call(fmt: ToolFormat, text: str) -> tuple[int, str, str] | None:
    """Where in ``text`` a call the token limit cut short begins, its name and its arguments
    as far as they went (``None``: no call began)."""
    marker = MARKER[fmt]
    if fmt is ToolFormat.LLAMA3:
        at = len(text) - len(text.lstrip())
        if not text[at:].startswith(("{", "<|python_tag|>")):
            return None
    else:
        at = text.find(marker)
        if at < 0:
            return None
    body = text[at:]
    if fmt is ToolFormat.MISTRAL_ARGS:
        called, _, so_far = body[len(marker) :].partition("[ARGS]")
        return at, called.strip(), so_far
    if fmt is ToolFormat.HARMONY:
        match = _HARMONY_CUT.search(body)
        if match is None:
            return at, "", ""
        return at, match.group(1), body[match.end() :] if match.group(0).endswith("<|message|>") else ""
    named = CALL_NAME.search(body)
    opened = CALL_ARGUMENTS.search(body)
    name = unquoted(named.group(1)) if named is not None else ""
    return at, name, body[opened.end() :] if opened is not None else ""


def parse_reply(
    fmt: ToolFormat, text: str, *, parallel: bool = True, new_id: NewId = new_call_id, cut: bool = False
) -> ToolReply:
    """``text`` (rendered with special tokens) read for calls in ``fmt``'s syntax. With
    ``parallel`` false only the first call is kept.

    ``cut``: the token limit ended the reply. A call it cut short is not left in the content
    as markup: it is returned as a call with its arguments as far as they went (OpenAI's
    answer to ``finish_reason: "length"``), and the content keeps only the text before it;
    a call cut before its name ends is dropped from the content with no call."""
    if cut and fmt is ToolFormat.HARMONY:  # its parser reads a cut message as content: cut first
        last = text.rfind("<|channel|>")
        if last >= 0 and "to=functions." in text[last:]:
            _, name, args = _cut_call(fmt, text[last:]) or (0, "", "")
            head = parse_reply(fmt, text[:last], parallel=parallel, new_id=new_id)
            calls = head.calls + ((ToolCall(new_id(), name, args),) if name else ())
            return attrs.evolve(head, calls=calls if parallel else calls[:1])
    reply = _PARSERS[fmt](text, new_id)
    if cut and fmt is not ToolFormat.HARMONY:
        found = _cut_call(fmt, reply.content)
        if found is not None:
            at, name, args = found
            calls = reply.calls + ((ToolCall(new_id(), name, args),) if name else ())
            reply = attrs.evolve(reply, content=reply.content[:at], calls=calls)
    if not parallel and len(reply.calls) > 1:
        reply = attrs.evolve(reply, calls=reply.calls[:1])
    return reply


def _held_tail(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@attrs.define
class ReplyGate:
    """Feed a streamed reply's pieces with ``feed()`` (each returns the text that is
    content for sure), then ``finish()`` for the rest, read for calls. Holds everything
    from the family's marker on (for ``llama3``, a reply whose first visible character is
    ``{``; for ``harmony``, everything: its channels come apart only at the end)."""

    fmt: ToolFormat
    parallel: bool = True
    new_id: NewId = new_call_id
    _held: str = ""
    _holding: bool = False
    _sent: str = ""

    def feed(self, piece: str) -> str:
        text = self._held + piece
        if self._holding or self.fmt is ToolFormat.HARMONY:
            self._held = text
            return ""
        if self.fmt is ToolFormat.LLAMA3:  # a call is the whole reply: decided by its first character
            first = text.lstrip()[:1]
            if not self._sent and (not first or first in "{<"):  # blanks so far, or a call may begin
                self._held, self._holding = text, bool(first)
                return ""
            self._held = ""
            self._sent += text
            return text
        marker = MARKER[self.fmt]
        at = text.find(marker)
        if at >= 0:
            self._held, self._holding = text[at:], True
            self._sent += text[:at]
            return text[:at]
        keep = _held_tail(text, marker)
        self._held = text[len(text) - keep :]
        out = text[: len(text) - keep]
        self._sent += out
        return out

    @property
    def held(self) -> str:
        """What the gate holds back so far."""
        return self._held

    def finish(self) -> ToolReply:
        """The reply's rest: content not sent yet, the calls, any channel reasoning."""
        held, self._held = self._held, ""
        whole = parse_reply(self.fmt, self._sent + held, parallel=self.parallel, new_id=self.new_id)
        if whole.content.startswith(self._sent):
            rest = whole.content[len(self._sent) :]
        else:
            rest = "" if whole.calls else held
        return ToolReply(rest, whole.calls, whole.reasoning)
