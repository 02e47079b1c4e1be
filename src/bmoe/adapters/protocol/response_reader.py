"""Response lines in, events out: a client's side of the protocol, without I/O.

The inverse of ``encode_response``. Keys this version does not know are ignored (the
protocol may add keys, never rename them). An integer is accepted where a float is expected;
``null`` in a float field reads back as NaN, and in ``choice_logp`` as ``None`` (it was minus
infinity). A line that breaks the protocol raises ``ProtocolError`` naming the line: the
engine on the other side is not one this client can talk to.
"""

from __future__ import annotations

import json
from collections import deque

from bmoe.adapters.protocol.converter import response_from_json
from bmoe.adapters.protocol.errors import ProtocolError
from bmoe.adapters.protocol.lines import LineSplitter, OversizeLine
from bmoe.adapters.protocol.responses import RESPONSE_TYPES, Response

_SHOWN = 200  # characters of a bad line quoted in the error


class ResponseReader:
    """Turns an engine's stdout bytes into response events, line by line. Blank lines are
    skipped. There is no line length limit: the engine is trusted not to flood.

    A bad line raises ``ProtocolError`` from the call that reaches it. Nothing else is lost:
    the events of the lines before it in the same call, and those of the lines after it,
    come from the next call (``feed(b"")`` will do).
    """

    def __init__(self) -> None:
        self._lines = LineSplitter()
        self._pending: deque[bytes] = deque()
        self._ready: list[Response] = []
        self._ended = False

    def feed(self, data: bytes) -> list[Response]:
        """The events of every line ``data`` completes."""
        if self._ended:
            raise ProtocolError("ResponseReader.feed called after feed_eof")
        return self._drain(self._lines.push(data))

    def feed_eof(self) -> list[Response]:
        """The output ended: the events still due, and that of a last line left without its
        ``\\n``, if any."""
        if self._ended:
            raise ProtocolError("ResponseReader.feed_eof called twice")
        self._ended = True
        return self._drain(self._lines.finish())

    def _drain(self, lines: list[bytes | OversizeLine]) -> list[Response]:
        for line in lines:
            assert not isinstance(line, OversizeLine)  # no limit was set
            self._pending.append(line)
        while self._pending:
            line = self._pending.popleft()
            if line.strip():
                self._ready.append(parse_response(line))
        events, self._ready = self._ready, []
        return events


def parse_response(line: bytes | str) -> Response:
    """One ``TAG {json}`` line (a trailing newline is allowed) as its event; raises
    ``ProtocolError`` naming the line when it is not one."""
    if isinstance(line, bytes):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f"at byte {exc.start + 1} in line {_quote(line)}"
            raise ProtocolError(f"not UTF-8: {exc.reason} {where}") from exc
    else:
        text = line
    text = text.rstrip("\r\n")
    tag, _, body = text.partition(" ")
    try:
        if tag not in RESPONSE_TYPES:
            raise ProtocolError(f'unknown tag "{tag}" (expected one of: {", ".join(RESPONSE_TYPES)})')
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"not JSON after {tag}: {exc}") from exc
        return response_from_json(tag, obj)
    except ProtocolError as exc:
        raise ProtocolError(f"{exc} in line {_quote(text)}") from exc


def _quote(line: str | bytes) -> str:
    return repr(line) if len(line) <= _SHOWN else repr(line[:_SHOWN]) + "..."
