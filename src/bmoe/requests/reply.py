"""One generation's reply as the server streams it: the pieces it emits while the session
generates (``progress``, once per token) and its outcome at the end (``finish``).

Answer text is let out once no stop string can still begin in it; with tools, text from the
first place a call could begin is held (``ReplyGate``), and calls a grammar holds stream as
OpenAI's argument deltas (``CallStreamer``). A stop string calls ``stop`` (the session's
``stop()`` for one request at a time; the sequence's for parallel ones) and cuts the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import Progress, RunResult, TokenLogprob
from bmoe.domain.tools import ReplyGate, ToolFormat, ToolUse
from bmoe.domain.tools.call_stream import CallStreamer
from bmoe.requests.neutral import Delta, Outcome, outcome
from bmoe.requests.stop import StopScanner

Emit = Callable[[Delta], None]


class ReplyStream:
    """Build with the request's stop strings, its tools (``None``: none shown), the chat
    template's call syntax and the reply's constraint; feed ``progress`` each token, then
    ``finish`` with the session's result."""

    def __init__(
        self,
        stops: Sequence[str],
        emit: Emit,
        stop: Callable[[], None],
        tools: ToolUse | None,
        fmt: ToolFormat | None,
        constraint: OutputConstraint | None,
        logprobs: bool,
    ) -> None:
        self.scanner = StopScanner(tuple(stops))
        self.emit = emit
        self._stop = stop
        self.logprobs = logprobs
        self.gate = ReplyGate(fmt, tools.parallel) if tools is not None and fmt is not None else None
        # calls a grammar holds parse by construction: their arguments stream as written
        held = constraint is not None and constraint.kind == "tool_calls"
        self.streamer = CallStreamer(fmt) if fmt is not None and self.gate is not None and held else None
        self._seen_reasoning: list[str] = []
        self._gated: list[str] = []  # the answer text let through the gate (all of it, without tools)
        self._kept: list[str] = []
        self._pending: list[TokenLogprob] = []

    @property
    def stopped(self) -> bool:
        """A stop string ended the reply."""
        return self.scanner.stopped

    def _send(self, text: str, reasoning: str) -> None:
        self._kept.append(text)
        delta = Delta(text, reasoning, tuple(self._pending))
        self._pending.clear()
        if not delta.empty:
            self.emit(delta)

    def progress(self, p: Progress) -> None:
        self._seen_reasoning.append(p.delta_reasoning)
        if p.logprob is not None:
            self._pending.append(p.logprob)
        piece = self.gate.feed(p.delta_text) if self.gate is not None else p.delta_text
        self._gated.append(piece)
        text = self.scanner.feed(piece)
        if self.scanner.stopped:
            self._stop()
        if text or p.delta_reasoning:
            self._send(text, p.delta_reasoning)
        if self.streamer is not None and self.gate is not None:
            calls = self.streamer.feed(self.gate.held)
            if calls:
                self.emit(Delta(call_deltas=tuple(calls)))

    def finish(self, result: RunResult) -> Outcome:
        """The reply's rest (what the session flushed after the last token, a held-back tag
        or UTF-8 tail, or with tools the content the gate held that is not a call), its
        calls, and the outcome."""
        rest = self.scanner.feed(result.text[len("".join(self._gated)) :])
        self._send(rest + self.scanner.finish(), result.reasoning[len("".join(self._seen_reasoning)) :])
        if self.streamer is not None:
            last, final = self.streamer.finish(result.tool_calls)
            result = attrs.evolve(result, tool_calls=final)
            if last:
                self.emit(Delta(call_deltas=tuple(last)))
        elif result.tool_calls:
            self.emit(Delta(tool_calls=result.tool_calls))
        return outcome(
            result,
            "".join(self._kept),
            stopped=self.scanner.stopped,
            logprobs=self.logprobs,
            stop_string=self.scanner.matched,
        )
