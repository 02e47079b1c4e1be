"""A reply's tool calls streamed as they are written: OpenAI's ``tool_calls`` deltas.

OpenAI streams a call as a first delta with its ``index``, ``id``, ``type`` and
``function.name`` (and the arguments so far), then deltas of ``function.arguments`` only;
a client joins them. ``CallStreamer`` reads the held text of a reply (what ``ReplyGate``
holds from the first call on) after each token and says what is new: a call whose name
is complete, arguments that grew. It holds back the characters that may still turn out
to be the call syntax's (closing braces, blanks) and hands them out in ``finish``, where the
reply's parsed calls say what the arguments were.

Only a reply a grammar holds to its calls is streamed this way (a forced tool choice, or
tools beside a response format): its calls parse by construction, so what was streamed is
what the reply holds. In free ``auto`` a block may turn out not to be a call (its text then
stays content), so the calls come whole once the reply is parsed. Every family but
``harmony``, whose channels come apart only at the end.
"""

from __future__ import annotations

from typing import Any

import attrs

from bmoe.domain.tools.formats import ToolFormat
from bmoe.domain.tools.replies import CALL_ARGUMENTS, CALL_NAME, NewId, unquoted
from bmoe.domain.tools.values import ToolCall, new_call_id

_HELD_BACK = " \t\r\n}],"


@attrs.frozen
class CallDelta:
    """One streamed piece of call ``index``: the first carries ``id`` and ``name``."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        """A chunk's ``tool_calls`` item."""
        if self.id:
            function = {"name": self.name, "arguments": self.arguments}
            return {"index": self.index, "id": self.id, "type": "function", "function": function}
        return {"index": self.index, "function": {"arguments": self.arguments}}


def _objects(body: str) -> list[str]:
    """The text of each JSON object that begins at the top level of ``body`` (in a
    Mistral list, each call), the last one as far as it goes."""
    starts: list[int] = []
    ends: list[int] = []
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(body):
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            if ch == "{" and depth == 0:
                starts.append(i)
            depth += ch == "{"
        elif ch == "}":
            depth -= 1
            if depth == 0:
                ends.append(i + 1)
    return [body[start : ends[n] if n < len(ends) else len(body)] for n, start in enumerate(starts)]


def _json_call(obj: str) -> tuple[str, str] | None:
    """A call object's name (once it is complete) and its arguments so far."""
    named = CALL_NAME.search(obj)
    if named is None or not named.group(2):
        return None
    opened = CALL_ARGUMENTS.search(obj, named.end())
    return unquoted(named.group(1)), obj[opened.end() :] if opened is not None else ""


def _json_calls(body: str) -> list[tuple[str, str]]:
    """Each call object in ``body`` that has its name, up to the first that does not."""
    found = []
    for obj in _objects(body):
        call = _json_call(obj)
        if call is None:
            break
        found.append(call)
    return found


def _without_partial(text: str, marker: str) -> str:
    """``text`` less an end that may be the start of ``marker`` (the syntax, half written)."""
    for n in range(min(len(marker), len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


def calls_begun(fmt: ToolFormat, held: str) -> list[tuple[str, str]]:
    """``(name, arguments so far)`` of each call ``held`` has begun and named."""
    if fmt is ToolFormat.MISTRAL_ARGS:
        out = []
        for part in _without_partial(held, "[TOOL_CALLS]").split("[TOOL_CALLS]")[1:]:
            name, sep, args = part.partition("[ARGS]")
            if not sep:
                break
            out.append((name.strip(), args))
        return out
    if fmt in (ToolFormat.HERMES, ToolFormat.GENERIC):
        out = []
        for block in _without_partial(held, "<tool_call>").split("<tool_call>")[1:]:
            body = _without_partial(block.split("</tool_call>")[0], "</tool_call>")
            out += _json_calls(body)[:1]
        return out
    if fmt is ToolFormat.MISTRAL:
        _, marker, body = held.partition("[TOOL_CALLS]")
        return _json_calls(body.lstrip()[1:]) if marker and body.lstrip().startswith("[") else []
    if fmt is ToolFormat.LLAMA3:
        return _json_calls(held)[:1]
    return []  # harmony: whole at the end


@attrs.define
class CallStreamer:
    """Feed the gate's held text with ``feed`` after each token; ``finish`` with the
    reply's parsed calls for the rest, with the ids the stream gave them."""

    fmt: ToolFormat
    new_id: NewId = new_call_id
    _ids: list[str] = attrs.field(factory=list)
    _sent: list[str] = attrs.field(factory=list)

    def feed(self, held: str) -> list[CallDelta]:
        deltas = []
        for i, (name, args) in enumerate(calls_begun(self.fmt, held)):
            ready = args.rstrip(_HELD_BACK)
            if i >= len(self._ids):
                self._ids.append(self.new_id())
                self._sent.append(ready)
                deltas.append(CallDelta(i, self._ids[i], name, ready))
            elif ready.startswith(self._sent[i]) and len(ready) > len(self._sent[i]):
                deltas.append(CallDelta(i, arguments=ready[len(self._sent[i]) :]))
                self._sent[i] = ready
        return deltas

    def finish(self, calls: tuple[ToolCall, ...]) -> tuple[list[CallDelta], tuple[ToolCall, ...]]:
        """The deltas that complete each of ``calls`` (the reply's, parsed) and the calls
        with the streamed ids. A call the stream began and the parse does not end the way it
        began (cannot happen under a grammar) is sent again whole under a new index."""
        deltas = []
        final = []
        extra = len(self._ids)
        for i, call in enumerate(calls):
            sent = self._sent[i] if i < len(self._sent) else None
            if sent is not None and call.arguments.startswith(sent):
                if len(call.arguments) > len(sent):
                    deltas.append(CallDelta(i, arguments=call.arguments[len(sent) :]))
                final.append(attrs.evolve(call, id=self._ids[i]))
                continue
            index = i if sent is None else extra
            extra += sent is not None
            deltas.append(CallDelta(index, call.id, call.name, call.arguments))
            final.append(call)
        return deltas, tuple(final)
