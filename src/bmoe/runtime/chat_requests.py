"""``Session.chat`` and ``chat_stream``: OpenAI-shaped messages and chat-completions fields
through the request core the server reads its bodies with (``bmoe.requests``), so that the
library and the server read, refuse and answer one request alike.

The fields become the body the server would have read (``chat_fields.chat_body``), parsed
by ``parse_chat_completion`` (a refusal is the ``RequestError`` the server answers 400 for)
and mapped by ``chat_turn``: the last message is the prompt, the conversation before it the
history, and the context keeps the longest prefix it shares with what the previous request
left. The reply goes through the server's ``ReplyStream`` (cut at a stop string, read for
tool calls) into its ``Outcome``. What a request leaves unsaid takes the session's defaults:
greedy sampling, ``SessionConfig.n_predict`` tokens (the server's come from its flags).

``reply_stream`` and ``follow_reply`` are how the server (``bmoe.serve.service``) and
``bmoe.Llama`` run a reply too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.tools import ToolUse
from bmoe.errors import DecodeAbortedError
from bmoe.requests.api_requests import parse_chat_completion
from bmoe.requests.chat_fields import Messages, chat_body
from bmoe.requests.mapping import ChatTurn, ServeDefaults, chat_turn
from bmoe.requests.neutral import Delta, Outcome
from bmoe.requests.reply import Emit, ReplyStream
from bmoe.runtime.pieces import Generates, follow
from bmoe.runtime.session_config import SessionConfig
from bmoe.service.session_engine import SessionEngine


class ChatSession(Generates, Protocol):
    """What a chat turn needs of the session that runs it (``Session``): its engine (the
    chat template's call syntax, the reply's grammar), its settings (``n_predict``), its
    ``generate``, ``cancel`` and ``stop`` (what a stop string calls)."""

    @property
    def engine(self) -> SessionEngine: ...

    @property
    def config(self) -> SessionConfig: ...

    def stop(self) -> None: ...


def reply_stream(
    engine: SessionEngine,
    request: GenerateRequest,
    stops: Sequence[str],
    emit: Emit,
    stop: Callable[[], None],
    *,
    chat: bool,
) -> ReplyStream:
    """The stream ``request``'s reply goes out through (``emit`` hears its pieces, ``stop``
    is what a stop string calls): with tools shown (chat mode), the chat template's call
    syntax (probed once, on need) and the reply's grammar, whose refusals
    (``ToolFormatError``, ``GrammarError``) raise here, before anything runs."""
    tools = ToolUse.shown(request.tools) if chat else None
    fmt = engine.renderer.tool_format if tools is not None else None
    constraint = engine.constraint(request) if tools is not None else None
    return ReplyStream(stops, emit, stop, tools, fmt, constraint, request.logprobs is not None)


def _finished(result: RunResult) -> RunResult:
    if result.cancelled:
        raise DecodeAbortedError("the generation was cancelled (Session.cancel)", 2)
    return result


@attrs.define
class _Items:
    """One reply read on the generation's worker thread: the pieces its ``ReplyStream``
    emits handed out as they come, then its ``Outcome``."""

    reply: ReplyStream
    pieces: list[Delta] = attrs.field(factory=list)

    def token(self, p: Progress) -> list[Delta | Outcome]:
        self.reply.progress(p)
        out: list[Delta | Outcome] = list(self.pieces)
        self.pieces.clear()
        return out

    def finish(self, result: RunResult) -> list[Delta | Outcome]:
        outcome = self.reply.finish(_finished(result))
        out: list[Delta | Outcome] = [*self.pieces, outcome]
        self.pieces.clear()
        return out


def follow_reply(
    session: ChatSession,
    request: GenerateRequest,
    stops: Sequence[str],
    history: Sequence[ChatMessage] | None,
    *,
    chat: bool,
) -> Iterator[Delta | Outcome]:
    """The reply's pieces as they are generated, then its ``Outcome``, the generation on a
    worker thread (``pieces.follow``: leaving the loop early cancels it); a generation
    cancelled otherwise (``Session.cancel``) raises ``DecodeAbortedError``."""
    pieces: list[Delta] = []
    items = _Items(
        reply_stream(session.engine, request, stops, pieces.append, session.stop, chat=chat), pieces
    )
    return follow(session, request, items.token, items.finish, history=history, chat=chat)


def _turn(
    session: ChatSession, messages: Messages, fields: Mapping[str, object]
) -> tuple[ChatTurn, tuple[str, ...]]:
    """The session's turn for the call, and its stop strings."""
    asked = parse_chat_completion(chat_body(messages, fields))
    return chat_turn(asked, ServeDefaults(max_tokens=session.config.n_predict)), asked.generation.stop


def _ignore(_: Delta) -> None:
    pass


def answer(session: ChatSession, messages: Messages, fields: Mapping[str, object]) -> Outcome:
    """``Session.chat``: the turn generated on the caller's thread, its ``Outcome``."""
    turn, stops = _turn(session, messages, fields)
    reply = reply_stream(session.engine, turn.request, stops, _ignore, session.stop, chat=True)
    result = session.generate(turn.request, reply.progress, history=turn.history, chat=True)
    return reply.finish(_finished(result))


def answer_stream(
    session: ChatSession, messages: Messages, fields: Mapping[str, object]
) -> Iterator[Delta | Outcome]:
    """``Session.chat_stream``: the turn's pieces, then its ``Outcome`` (a refusal raises
    here, before the loop)."""
    turn, stops = _turn(session, messages, fields)
    return follow_reply(session, turn.request, stops, turn.history, chat=True)
