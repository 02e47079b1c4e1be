"""A reply as an app reads it while it is generated: ``Piece`` values (``Session.stream``).

The session reports each token as a ``Progress`` (answer text and reasoning it adds); a
``PieceReader`` turns those into pieces and, at the end, the pieces that complete the reply
and a last piece carrying the ``RunResult``. Without tools every token's text goes out as it
comes. With tools, text from the first place a call could begin is held (``ReplyGate``), and
calls a grammar holds (a forced tool choice, tools beside a response format) stream as
OpenAI's argument deltas (``CallStreamer``); calls of a free ``auto`` reply come whole at the
end, once the reply is parsed. Pure: no thread, no session.
"""

from __future__ import annotations

import attrs

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import Progress, RunResult, TokenLogprob
from bmoe.domain.tools import ReplyGate, ToolCall, ToolFormat, ToolUse
from bmoe.domain.tools.call_stream import CallDelta, CallStreamer


@attrs.frozen
class Piece:
    """One piece of a reply: answer ``text`` and ``reasoning`` it adds (either may be
    empty); ``logprob`` the token's when the request asked for them; ``call_deltas``
    pieces of tool calls streamed as written, or ``tool_calls`` whole calls at the end.
    The last piece of a stream carries the ``result`` (and nothing else)."""

    text: str = ""
    reasoning: str = ""
    logprob: TokenLogprob | None = None
    call_deltas: tuple[CallDelta, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    result: RunResult | None = None

    @property
    def final(self) -> bool:
        """The last piece: ``result`` is the generation's."""
        return self.result is not None


class PieceReader:
    """Feed ``progress`` with each token's ``Progress``, then ``finish`` with the result.

    ``tools``: the tools the reply may call (``None``: none shown); ``fmt``: the chat
    template's call syntax; ``constraint``: the reply's grammar (calls held by one stream as
    deltas)."""

    def __init__(
        self,
        tools: ToolUse | None = None,
        fmt: ToolFormat | None = None,
        constraint: OutputConstraint | None = None,
    ) -> None:
        self.gate = ReplyGate(fmt, tools.parallel) if tools is not None and fmt is not None else None
        held = constraint is not None and constraint.kind == "tool_calls"
        self.streamer = CallStreamer(fmt) if fmt is not None and self.gate is not None and held else None
        self._text: list[str] = []  # the answer text let out so far
        self._reasoning: list[str] = []

    def progress(self, p: Progress) -> list[Piece]:
        """The pieces one token adds (none when the gate holds all it brought)."""
        text = self.gate.feed(p.delta_text) if self.gate is not None else p.delta_text
        self._text.append(text)
        self._reasoning.append(p.delta_reasoning)
        pieces = []
        if text or p.delta_reasoning or p.logprob is not None:
            pieces.append(Piece(text, p.delta_reasoning, p.logprob))
        if self.streamer is not None and self.gate is not None:
            calls = self.streamer.feed(self.gate.held)
            if calls:
                pieces.append(Piece(call_deltas=tuple(calls)))
        return pieces

    def finish(self, result: RunResult) -> list[Piece]:
        """The reply's rest (what the session flushed after the last token, or with tools
        the content the gate held that is not a call), its calls, and the final piece (its
        result's calls with the ids the stream gave them). A cancelled result adds only the
        final piece."""
        if result.cancelled:
            return [Piece(result=result)]
        pieces = []
        rest = result.text[len("".join(self._text)) :]
        rest_reasoning = result.reasoning[len("".join(self._reasoning)) :]
        if rest or rest_reasoning:
            pieces.append(Piece(rest, rest_reasoning))
        if self.streamer is not None:
            last, final = self.streamer.finish(result.tool_calls)
            result = attrs.evolve(result, tool_calls=final)
            if last:
                pieces.append(Piece(call_deltas=tuple(last)))
        elif result.tool_calls:
            pieces.append(Piece(tool_calls=result.tool_calls))
        pieces.append(Piece(result=result))
        return pieces
