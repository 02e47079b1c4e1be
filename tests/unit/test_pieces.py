"""``Session.stream`` / ``astream``'s machinery on a scripted session: pieces in order, the
result last, errors raised in the loop, and leaving the loop cancelling the generation
(``bmoe.runtime.pieces``); ``PieceReader``'s tool-call pieces (``bmoe.domain.pieces``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.pieces import Piece, PieceReader
from bmoe.domain.tools import Tool, ToolCall, ToolChoice, ToolFormat, ToolUse
from bmoe.errors import DecodeError
from bmoe.runtime import pieces
from bmoe.service.session_engine import OnBegin, OnProgress

WORDS = ("Hello", ",", " wor", "ld")


class ScriptedSession:
    """``generate`` reports ``words`` one token each, waiting for ``go`` before each token
    after the first ``pace`` ones; ``cancel`` ends it at the next token (a cancelled
    result), as ``SessionEngine`` does; ``fail`` raises in place of the tokens."""

    def __init__(self, words: Sequence[str] = WORDS, pace: int | None = None, fail: bool = False) -> None:
        self.words, self.pace, self.fail = words, pace, fail
        self.go = threading.Event()
        self.cancelled = threading.Event()
        self.running = False
        self.calls: list[tuple[GenerateRequest, Sequence[ChatMessage] | None, bool | None]] = []
        self.finished = threading.Event()

    def generate(
        self,
        request: GenerateRequest,
        on_progress: OnProgress | None = None,
        on_begin: OnBegin | None = None,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> RunResult:
        self.calls.append((request, history, chat))
        self.running = True
        try:
            if on_begin is not None:
                on_begin()
            if self.fail:
                raise DecodeError("scripted failure", -1)
            done: list[str] = []
            for i, word in enumerate(self.words):
                if self.pace is not None and i >= self.pace:
                    self.go.wait(timeout=10)
                if self.cancelled.is_set():
                    return _result(done, cancelled=True)
                done.append(word)
                if on_progress is not None:
                    on_progress(Progress(i + 1, len(self.words), 1.0, word, ""))
            return _result(done)
        finally:
            self.running = False
            self.finished.set()

    def cancel(self) -> None:
        if self.running:
            self.cancelled.set()
            self.go.set()


def _result(words: list[str], *, cancelled: bool = False) -> RunResult:
    tokens = tuple(range(len(words)))
    return RunResult("".join(words), "", tokens, 3, 3 + len(words), 0.0, 0.0, cancelled=cancelled)


def test_the_stream_gives_each_token_s_text_then_the_result_last() -> None:
    session = ScriptedSession()
    got = list(pieces.stream(session, PieceReader(), GenerateRequest("hi"), chat=False))
    assert [p.text for p in got[:-1]] == list(WORDS)
    assert got[-1].final and got[-1].result is not None
    assert got[-1].result.text == "".join(WORDS)
    assert not any(p.final for p in got[:-1])
    assert session.calls[0][2] is False  # chat passed through


def test_nothing_runs_before_the_loop_asks() -> None:
    session = ScriptedSession()
    stream = pieces.stream(session, PieceReader(), GenerateRequest("hi"))
    assert session.calls == []
    assert next(iter(stream)).text == "Hello"
    with contextlib.suppress(StopIteration):
        list(stream)


def test_breaking_out_of_the_loop_cancels_the_generation_and_waits_for_it() -> None:
    session = ScriptedSession(pace=1)
    for piece in pieces.stream(session, PieceReader(), GenerateRequest("hi")):
        assert piece.text == "Hello"
        break
    # the loop dropped the generator: it was closed, the generation cancelled and ended
    assert session.cancelled.is_set()
    assert session.finished.is_set()


def test_an_error_of_the_generation_is_raised_in_the_loop() -> None:
    session = ScriptedSession(fail=True)
    with pytest.raises(DecodeError, match="scripted failure"):
        list(pieces.stream(session, PieceReader(), GenerateRequest("hi")))


def test_a_generation_abandoned_before_it_begins_is_cancelled_as_it_begins() -> None:
    """Its request waits for another's turn: ``cancel`` then would stop the other one, so
    the cancel waits for this one to begin."""
    session = ScriptedSession(pace=0)
    items: list[str] = []
    worker = pieces._Worker(session, GenerateRequest("hi"), lambda p: [p.delta_text], lambda r: [r.text],
                            items.append, None, None)  # fmt: skip
    worker.abandon()
    assert not session.cancelled.is_set()  # nothing in flight: nothing cancelled
    worker.thread.start()
    worker.thread.join(timeout=10)
    assert session.cancelled.is_set()
    assert items[0] == "" and items[-1] is pieces._END  # the cancelled result, nothing generated


def test_astream_gives_the_same_pieces_without_blocking_the_event_loop() -> None:
    session = ScriptedSession()

    async def main() -> tuple[list[Piece], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        got = [p async for p in pieces.astream(session, PieceReader(), GenerateRequest("hi"))]
        ticker.cancel()
        return got, ticks

    got, ticks = asyncio.run(main())
    assert [p.text for p in got[:-1]] == list(WORDS)
    assert got[-1].result is not None and got[-1].result.text == "".join(WORDS)
    assert ticks > 0


def test_leaving_an_async_loop_cancels_the_generation() -> None:
    session = ScriptedSession(pace=1)

    async def main() -> None:
        async with contextlib.aclosing(
            pieces.astream(session, PieceReader(), GenerateRequest("hi"))
        ) as stream:
            async for piece in stream:
                assert piece.text == "Hello"
                break

    asyncio.run(main())
    assert session.cancelled.is_set()
    assert session.finished.is_set()


def test_an_async_error_is_raised_in_the_loop() -> None:
    session = ScriptedSession(fail=True)

    async def main() -> None:
        async for _ in pieces.astream(session, PieceReader(), GenerateRequest("hi")):
            pass

    with pytest.raises(DecodeError):
        asyncio.run(main())


# -- PieceReader ---------------------------------------------------------------------------

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
CALL_TEXT = ("<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}', "</tool_call>")


def _feed(reader: PieceReader, texts: Sequence[str]) -> list[Piece]:
    out = []
    for i, text in enumerate(texts):
        out += reader.progress(Progress(i + 1, len(texts), 1.0, text, ""))
    return out


def test_reasoning_and_a_flushed_rest_come_as_pieces() -> None:
    reader = PieceReader()
    got = reader.progress(Progress(1, 2, 1.0, "", "thinking"))
    got += reader.progress(Progress(2, 2, 1.0, "Hi", ""))
    result = RunResult("Hi!", "thinking.", (1, 2), 1, 3, 0.0, 0.0)
    got += reader.finish(result)
    assert [(p.text, p.reasoning) for p in got[:-1]] == [("", "thinking"), ("Hi", ""), ("!", ".")]
    assert got[-1].result == result


def test_forced_calls_stream_as_deltas_and_the_result_keeps_their_ids() -> None:
    tools = ToolUse((WEATHER,), ToolChoice("function", "get_weather"))
    fmt = ToolFormat.HERMES
    reader = PieceReader(tools, fmt, OutputConstraint.tool_calls(fmt, tools))
    got = _feed(reader, CALL_TEXT)
    parsed = ToolCall("call_parsed", "get_weather", '{"city": "Paris"}')
    got += reader.finish(RunResult("", "", (1,) * 5, 1, 6, 0.0, 0.0, tool_calls=(parsed,)))
    deltas = [d for p in got for d in p.call_deltas]
    assert not any(p.text for p in got)
    assert deltas[0].name == "get_weather" and deltas[0].id.startswith("call_")
    assert "".join(d.arguments for d in deltas) == '{"city": "Paris"}'
    final = got[-1].result
    assert final is not None and final.tool_calls[0].id == deltas[0].id


def test_calls_of_a_free_reply_come_whole_at_the_end() -> None:
    tools = ToolUse((WEATHER,), ToolChoice("auto"))
    reader = PieceReader(tools, ToolFormat.HERMES, None)
    got = _feed(reader, ("Sure. ", *CALL_TEXT))
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    got += reader.finish(RunResult("Sure. ", "", (1,) * 6, 1, 7, 0.0, 0.0, tool_calls=(call,)))
    assert "".join(p.text for p in got) == "Sure. "
    assert not any(p.call_deltas for p in got)
    assert [p.tool_calls for p in got if p.tool_calls] == [(call,)]


def test_a_cancelled_result_adds_only_the_final_piece() -> None:
    reader = PieceReader()
    reader.progress(Progress(1, 4, 1.0, "Hel", ""))
    result = RunResult("Hello", "", (1, 2), 1, 1, 0.0, 0.0, cancelled=True)
    assert reader.finish(result) == [Piece(result=result)]
