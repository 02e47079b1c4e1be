"""Split a model's streamed output into reasoning (``<think>...</think>``) and answer.

A thinking model opens its reply with ``<think>``, reasons, closes with ``</think>``, then
answers. The text arrives in pieces that may cut a tag anywhere, so the splitter holds
back any tail that could still become a tag. Whitespace between ``</think>`` and the
answer is dropped, as chat templates do when they re-render a turn.
"""

from __future__ import annotations

import attrs

OPEN = "<think>"
CLOSE = "</think>"


@attrs.frozen
class Delta:
    """What one piece of output adds to the answer and to the reasoning."""

    text: str = ""
    reasoning: str = ""


def _held_tail(buffer: str, tag: str) -> int:
    """Length of the longest suffix of ``buffer`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:n]):
            return n
    return 0


@attrs.define
class ReasoningSplitter:
    """Feed pieces with ``feed()``, then ``finish()``; the deltas add up to the whole output.

    States: ``start`` (before any visible text: a ``<think>`` here opens reasoning),
    ``reasoning`` (until ``</think>``), ``after`` (whitespace after ``</think>`` is dropped),
    ``answer``.
    """

    state: str = "start"
    _buffer: str = ""

    def feed(self, piece: str) -> Delta:
        self._buffer += piece
        text: list[str] = []
        reasoning: list[str] = []
        while self._buffer:
            buf = self._buffer
            if self.state == "start":
                stripped = buf.lstrip()
                if not stripped:
                    return Delta("".join(text), "".join(reasoning))  # hold leading whitespace
                if stripped.startswith(OPEN):
                    self.state, self._buffer = "reasoning", stripped[len(OPEN) :]
                elif OPEN.startswith(stripped):
                    break  # could still become <think>
                else:
                    self.state = "answer"
            elif self.state == "reasoning":
                at = buf.find(CLOSE)
                if at >= 0:
                    reasoning.append(buf[:at])
                    self.state, self._buffer = "after", buf[at + len(CLOSE) :]
                else:
                    keep = _held_tail(buf, CLOSE)
                    reasoning.append(buf[: len(buf) - keep])
                    self._buffer = buf[len(buf) - keep :]
                    break
            elif self.state == "after":
                stripped = buf.lstrip()
                self._buffer = stripped
                if stripped:
                    self.state = "answer"
                else:
                    break
            else:  # answer
                text.append(buf)
                self._buffer = ""
        return Delta("".join(text), "".join(reasoning))

    def finish(self) -> Delta:
        """Flush what was held back (an unfinished tag is plain text of its state)."""
        buf, self._buffer = self._buffer, ""
        if self.state == "reasoning":
            return Delta(reasoning=buf)
        if self.state == "after":
            return Delta()
        if self.state == "start":
            return Delta(text=buf.strip() and buf)
        return Delta(text=buf)
