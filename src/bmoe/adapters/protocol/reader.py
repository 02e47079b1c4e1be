"""Request lines in, events out: the session's side of the protocol, without I/O.

``RequestReader`` is fed the bytes of stdin as they come and returns, per complete line, one
request event or one ``BadRequest``; it never raises on what a client sent. Blank lines are
skipped. ``feed_eof`` parses a last line left without its ``\\n`` and ends with
``EndOfInput``.
"""

from __future__ import annotations

import json

from bmoe.adapters.protocol.converter import request_from_json
from bmoe.adapters.protocol.errors import ProtocolError
from bmoe.adapters.protocol.lines import LineSplitter, OversizeLine
from bmoe.adapters.protocol.requests import BadRequest, EndOfInput, ReaderEvent, Request

DEFAULT_MAX_LINE_BYTES = 1 << 20
"""A request line longer than this (1 MiB, without its ``\\n``) is refused."""


class RequestReader:
    """Turns the bytes a client sends into events, line by line.

    >>> reader = RequestReader()
    >>> reader.feed(b'{"cmd":"generate","id":1,"prompt":"Hi"}\\n{"cmd":"clo')
    [GenerateCmd(id=1, prompt='Hi', n_predict=None, think=None, clear_kv=True)]
    >>> reader.feed(b'se"}\\n')
    [CloseCmd(id=None)]
    >>> reader.feed_eof()
    [EndOfInput()]
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._lines = LineSplitter(max_line_bytes)
        self._ended = False

    def feed(self, data: bytes) -> list[ReaderEvent]:
        """The events of every line ``data`` completes; ``[]`` while a line is still partial."""
        if self._ended:
            raise ProtocolError("RequestReader.feed called after feed_eof")
        return _events(self._lines.push(data))

    def feed_eof(self) -> list[ReaderEvent]:
        """The input ended: the last, unterminated line's event if any, then ``EndOfInput``."""
        if self._ended:
            raise ProtocolError("RequestReader.feed_eof called twice")
        self._ended = True
        events = _events(self._lines.finish())
        events.append(EndOfInput())
        return events


def _events(lines: list[bytes | OversizeLine]) -> list[ReaderEvent]:
    events: list[ReaderEvent] = []
    for line in lines:
        if isinstance(line, OversizeLine):
            events.append(BadRequest(None, f"line longer than {line.limit} bytes"))
        elif line.strip():
            events.append(parse_request(line))
    return events


def parse_request(line: bytes | str) -> Request | BadRequest:
    """One request line (without its newline) as a request or a ``BadRequest``; never raises."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return BadRequest(None, f"not UTF-8: {exc.reason} at byte {exc.start + 1}")
    line = line.removeprefix("\ufeff")  # a byte order mark some editors and shells write first
    try:
        obj = json.loads(line, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        # Some of json's messages end in "at" ("Unterminated string starting at").
        return BadRequest(None, f"not JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}")
    except _NonStandardConstant as exc:
        return BadRequest(None, f"not JSON: {exc.args[0]} is not a JSON value")
    except RecursionError:
        return BadRequest(None, "not JSON: nested too deeply")
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        return BadRequest(None, f"not JSON: {exc}")
    return request_from_json(obj)


class _NonStandardConstant(Exception):
    pass


def _refuse_constant(name: str) -> object:
    raise _NonStandardConstant(name)
