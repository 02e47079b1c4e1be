"""Bytes in, complete lines out: the framing both readers share.

A line ends at ``\\n``; a ``\\r`` before it is dropped. Data may arrive in any pieces (a line
split across chunks, many lines in one chunk) and gives the same lines either way. With a
limit, a line longer than ``max_line_bytes`` (counted without its ``\\n``) is reported once,
as soon as it is known to be too long, and skipped up to the next ``\\n``; the lines after
it are read normally. Memory stays within the limit however long the line.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class OversizeLine:
    """Stands in for a line longer than the limit (its bytes are dropped)."""

    limit: int


class LineSplitter:
    """Splits a byte stream into lines. ``push`` and ``finish`` return each complete line
    (``bytes`` without its ending) or an ``OversizeLine`` in stream order."""

    def __init__(self, max_line_bytes: int | None = None) -> None:
        if max_line_bytes is not None and max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, not {max_line_bytes}")
        self._limit = max_line_bytes
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already known to hold no b"\n"
        self._skipping = False  # inside an oversize line, dropping bytes up to the next b"\n"

    def push(self, data: bytes) -> list[bytes | OversizeLine]:
        """Every line that ``data`` completes (and an oversize line as soon as it is one)."""
        out: list[bytes | OversizeLine] = []
        self._buf += data
        start = 0
        while True:
            end = self._buf.find(b"\n", max(start, self._scanned))
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            elif self._limit is not None and end - start > self._limit:
                out.append(OversizeLine(self._limit))
            else:
                out.append(_strip_cr(bytes(self._buf[start:end])))
            start = end + 1
            self._scanned = start
        del self._buf[:start]
        self._scanned = len(self._buf)
        if self._limit is not None and len(self._buf) > self._limit:
            if not self._skipping:
                self._skipping = True
                out.append(OversizeLine(self._limit))
            self._buf.clear()
            self._scanned = 0
        return out

    def finish(self) -> list[bytes | OversizeLine]:
        """The last line, when the stream ended without a ``\\n`` after it."""
        rest, skipping = bytes(self._buf), self._skipping
        self._buf.clear()
        self._scanned = 0
        self._skipping = False
        return [_strip_cr(rest)] if rest and not skipping else []


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line
