"""The served session: each request's work, run on the worker's thread.

``ServedSession`` owns the worker and knows the session's API; it knows nothing of HTTP.
A generation streams its pieces through ``emit`` (called on the worker's thread) as they
are final: reasoning as the session splits it, answer text once no stop string can still
begin in it. A stop string asks the session to ``stop()`` (the turn is kept, not rolled
back) and cuts the text; a cancel (the client went away) ends the job with
``RequestCancelledError``. Every request and token is reported to ``monitor`` (the live
metrics feed's source).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.live import ExpertSnapshot
from bmoe.domain.tools import ToolUse
from bmoe.runtime import Session
from bmoe.serve.api_requests import ChatCompletionRequest, CompletionRequest
from bmoe.serve.api_responses import Delta, ModelCard, Outcome
from bmoe.serve.errors import RequestCancelledError
from bmoe.serve.live import Kind
from bmoe.serve.mapping import ServeDefaults, chat_turn, completion_request, fill_context
from bmoe.serve.monitor import EngineMonitor
from bmoe.serve.reply import ReplyStream
from bmoe.serve.worker import Job, SessionWorker

T = TypeVar("T")

Emit = Callable[[Delta], None]


def _ignore(_: Delta) -> None:
    pass


class ServedSession:
    """A session behind the server: requests queue on one worker thread. It owns the
    session: ``close()`` closes it."""

    def __init__(self, session: Session, card: ModelCard, defaults: ServeDefaults | None = None) -> None:
        self.session = session
        self.card = card
        self.defaults = defaults or ServeDefaults()
        self.worker = SessionWorker(self._cancel)
        self.monitor = EngineMonitor(lambda: session.feeding)

    def _cancel(self) -> None:
        self.session.cancel()  # looked up at each call, so a test may wrap it

    @property
    def model_id(self) -> str:
        return self.card.id

    @property
    def streaming(self) -> bool:
        """Whether the session streams experts (else it runs resident: no expert cache)."""
        return self.session.streaming is not None

    def expert_snapshot(self, timeout: float) -> ExpertSnapshot | None:
        """The expert cache now, from any thread (waits up to ``timeout`` seconds for the
        decode in flight); None when the session does not stream or it did not come."""
        streaming = self.session.streaming
        return streaming.snapshot(timeout) if streaming is not None else None

    def chat(self, asked: ChatCompletionRequest, emit: Emit = _ignore) -> Job[Outcome]:
        """Queue a chat completion (``RequestError`` now if the request cannot be one)."""
        turn = chat_turn(asked, self.defaults)
        stops = asked.generation.stop
        history = turn.history
        return self.worker.submit(
            self._watched("chat", lambda job: self._generate(job, turn.request, stops, emit, history, True))
        )

    def complete(self, asked: CompletionRequest, emit: Emit = _ignore) -> Job[Outcome]:
        """Queue a text completion."""
        request = completion_request(asked, self.defaults)
        stops = asked.generation.stop
        return self.worker.submit(
            self._watched("completion", lambda job: self._generate(job, request, stops, emit, None, False))
        )

    def decide(self, request: DecideRequest) -> Job[DecideResult]:
        """Queue a decision."""

        def work(job: Job[DecideResult]) -> DecideResult:
            result = self.session.decide(request, on_begin=job.began)
            if result.cancelled:
                raise RequestCancelledError("the decision was cancelled")
            return result

        return self.worker.submit(self._watched("decide", work))

    def close(self, timeout: float | None = None) -> None:
        """Cancel what runs and what waits, take no more requests, close the session."""
        self.worker.close(timeout)
        self.session.close()

    # -- on the worker's thread ------------------------------------------------------------

    def _watched(self, kind: Kind, work: Callable[[Job[T]], T]) -> Callable[[Job[T]], T]:
        """``work``, run as one request the engine monitor follows (the live view)."""

        def run(job: Job[T]) -> T:
            with self.monitor.request(kind):
                return work(job)

        return run

    def _generate(
        self,
        job: Job[Outcome],
        request: GenerateRequest,
        stops: Sequence[str],
        emit: Emit,
        history: Sequence[ChatMessage] | None,
        chat: bool,
    ) -> Outcome:
        if request.n_predict is None:
            prompt = self.session.engine.render_prompt(request, history=history, chat=chat)
            request = fill_context(request, len(prompt), self.session.n_ctx)
        tools = ToolUse.shown(request.tools) if chat else None
        fmt = self.session.engine.renderer.tool_format if tools is not None else None  # probed once, on need
        constraint = self.session.engine.constraint(request) if tools is not None else None
        wants_logprobs = request.logprobs is not None
        reply = ReplyStream(stops, emit, self.session.stop, tools, fmt, constraint, wants_logprobs)

        def on_progress(p: Progress) -> None:
            self.monitor.token(p)
            reply.progress(p)

        result = self.session.generate(request, on_progress, job.began, history=history, chat=chat)
        if result.cancelled:
            raise RequestCancelledError("the request was cancelled")
        return reply.finish(result)


def new_id(prefix: str) -> str:
    """A response id: ``chatcmpl-...``, ``cmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex}"
