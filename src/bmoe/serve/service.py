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

import functools
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.live import ExpertSnapshot
from bmoe.errors import BmoeError, ContextOverflowError
from bmoe.requests.api_requests import CompletionRequest
from bmoe.requests.mapping import (
    ServeDefaults,
    chat_turn,
    completion_request,
    fewest_tokens,
    fill_context,
    message_texts,
)
from bmoe.requests.neutral import ChatRequest, Delta, Outcome
from bmoe.requests.reply import ReplyStream
from bmoe.runtime import Session
from bmoe.runtime.chat_requests import reply_stream
from bmoe.serve.api_responses import ModelCard
from bmoe.serve.errors import RequestCancelledError, ServerClosedError
from bmoe.serve.live import Kind
from bmoe.serve.monitor import EngineMonitor
from bmoe.serve.prometheus import ServedTotals
from bmoe.serve.worker import Job, SessionWorker
from bmoe.service.parallel_jobs import ParallelEntry

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
        self.totals = ServedTotals()  # since the server started: GET /metrics
        # parallel sequences (-np N > 1): generations go to a batch run on the worker
        self.parallel = session.n_seq
        self._inbox: list[ParallelEntry] = []
        self._inbox_lock = threading.Lock()
        self._run_queued = False
        self._closing = False

    def _cancel(self) -> None:
        self.session.cancel()  # looked up at each call, so a test may wrap it

    @property
    def model_id(self) -> str:
        return self.card.id

    @property
    def streaming(self) -> bool:
        """Whether the session streams experts (else it runs resident: no expert cache)."""
        return self.session.streaming is not None

    @property
    def drafting(self) -> bool:
        """Whether the session drafts (``--draft copy``, on a model whose memory allows it)."""
        return self.session.engine.defaults.draft is not None

    def expert_snapshot(self, timeout: float) -> ExpertSnapshot | None:
        """The expert cache now, from any thread (waits up to ``timeout`` seconds for the
        decode in flight); None when the session does not stream or it did not come."""
        streaming = self.session.streaming
        return streaming.snapshot(timeout) if streaming is not None else None

    def chat(self, asked: ChatRequest, emit: Emit = _ignore) -> Job[Outcome]:
        """Queue a chat completion (``RequestError`` now if the request cannot be one)."""
        turn = chat_turn(asked, self.defaults)
        self._refuse_past_context(message_texts(asked.messages))
        stops = asked.generation.stop
        history = turn.history
        most = turn.most
        if self.parallel > 1:
            return self._parallel(turn.request, stops, emit, history, True, most)
        return self.worker.submit(
            self._watched(
                "chat", lambda job: self._generate(job, turn.request, stops, emit, history, True, most)
            )
        )

    def prompt_tokens(self, asked: ChatRequest) -> int:
        """How many tokens ``asked``'s prompt renders to (chat template, tools and all); on
        the caller's thread (the tokenizer only, no compute)."""
        turn = chat_turn(asked, self.defaults)
        self._refuse_past_context(message_texts(asked.messages))
        return len(self.session.engine.render_prompt(turn.request, history=turn.history, chat=True))

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The most bytes one token of the model's vocabulary stands for (0: unknown)."""
        model = getattr(self.session, "model", None)
        if model is None:
            return 0
        return max((len(model.token_bytes(t, special=True)) for t in range(model.n_vocab)), default=0)

    def _refuse_past_context(self, texts: Sequence[str]) -> None:
        """Refuse a prompt too long for the context before it is tokenized: one whose text
        needs more tokens than the context holds, even if every token were the longest."""
        if sum(len(t) for t in texts) <= self.session.n_ctx:
            return  # it may fit: only the tokenizer can say
        fewest = fewest_tokens(texts, self.longest_token_bytes)
        if fewest > self.session.n_ctx:
            raise ContextOverflowError(
                f"the prompt needs at least {fewest} tokens, past the context of {self.session.n_ctx} "
                "tokens (refused before tokenizing it)"
            )

    def complete(self, asked: CompletionRequest, emit: Emit = _ignore) -> Job[Outcome]:
        """Queue a text completion."""
        request = completion_request(asked, self.defaults)
        self._refuse_past_context([asked.prompt])
        stops = asked.generation.stop
        if self.parallel > 1:
            return self._parallel(request, stops, emit, None, False)
        return self.worker.submit(
            self._watched("completion", lambda job: self._generate(job, request, stops, emit, None, False))
        )

    def _parallel(
        self,
        request: GenerateRequest,
        stops: Sequence[str],
        emit: Emit,
        history: Sequence[ChatMessage] | None,
        chat: bool,
        most: int | None = None,
    ) -> Job[Outcome]:
        """A generation as one sequence of the batch run: it joins the run at its next step
        (or starts one on the worker). Its default ``max_tokens`` is what its slot's share of
        the context (``n_ctx / N``, as llama.cpp's server gives each slot) leaves."""
        job: Job[Outcome] = Job(_never_run, lambda: None)  # settled by the run
        try:
            request, reply = self._reply(
                request, stops, emit, history, chat, self.session.n_ctx // self.parallel, lambda: None, most
            )
        except BmoeError as exc:
            job.settle(error=exc)
            return job
        sink = _Sequence(job, reply, self.monitor, self.totals, lambda: self._closing)
        with self._inbox_lock:
            if self._closing:
                job.settle(error=ServerClosedError("the server is shutting down"))
                return job
            self._inbox.append(ParallelEntry(request, sink, chat, history))
            start = not self._run_queued
            self._run_queued = True
        if start:
            self.worker.submit(self._watched("chat" if chat else "completion", self._run_batch))
        return job

    def slots(self) -> tuple[int, int, int]:
        """The parallel sequences, those running a request now, the requests waiting for one
        (without ``-np``: 1, and whether a request runs, and how many are queued)."""
        if self.parallel <= 1:
            return 1, int(self.monitor.view().state != "idle"), self.worker.pending
        with self._inbox_lock:
            waiting = len(self._inbox)
        return self.parallel, self.session.parallel_running, waiting

    def _run_batch(self, _job: Job[None]) -> None:
        self.session.run_parallel(self._take)

    def _take(self, idle: bool) -> list[ParallelEntry]:
        """The requests that came since the last step; an idle run with none ends (and the
        next request starts another)."""
        with self._inbox_lock:
            entries, self._inbox = self._inbox, []
            if not entries and idle:
                self._run_queued = False
            return entries

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
        with self._inbox_lock:
            self._closing = True  # parallel sequences end at their next token
            waiting, self._inbox = self._inbox, []
        for entry in waiting:
            entry.sink.failed(ServerClosedError("the server is shutting down"))
        self.worker.close(timeout)
        self.session.close()

    # -- on the worker's thread ------------------------------------------------------------

    def _watched(self, kind: Kind, work: Callable[[Job[T]], T]) -> Callable[[Job[T]], T]:
        """``work``, run as one request the engine monitor follows (the live view)."""

        def run(job: Job[T]) -> T:
            with self.monitor.request(kind):
                return work(job)

        return run

    def _reply(
        self,
        request: GenerateRequest,
        stops: Sequence[str],
        emit: Emit,
        history: Sequence[ChatMessage] | None,
        chat: bool,
        n_ctx: int,
        stop: Callable[[], None],
        most: int | None = None,
    ) -> tuple[GenerateRequest, ReplyStream]:
        """``request`` with its default ``max_tokens`` (what its prompt leaves of ``n_ctx``,
        at most ``most``) and the stream its reply goes out through (``stop``: what a stop
        string calls)."""
        if request.n_predict is None:
            prompt = self.session.engine.render_prompt(request, history=history, chat=chat)
            request = fill_context(request, len(prompt), n_ctx, most=most)
        return request, reply_stream(self.session.engine, request, stops, emit, stop, chat=chat)

    def _generate(
        self,
        job: Job[Outcome],
        request: GenerateRequest,
        stops: Sequence[str],
        emit: Emit,
        history: Sequence[ChatMessage] | None,
        chat: bool,
        most: int | None = None,
    ) -> Outcome:
        request, reply = self._reply(
            request, stops, emit, history, chat, self.session.n_ctx, self.session.stop, most
        )

        def on_progress(p: Progress) -> None:
            self.monitor.token(p)
            self.totals.token(p)
            reply.progress(p)

        result = self.session.generate(request, on_progress, job.began, history=history, chat=chat)
        if result.cancelled:
            raise RequestCancelledError("the request was cancelled")
        self.totals.finished(result)
        return reply.finish(result)


def _never_run(_job: Job[Outcome]) -> Outcome:
    raise AssertionError("a parallel request's job is settled by the batch run, never run")


class _Sequence:
    """One parallel request's ``ParallelSink``: its tokens go to its reply (and the live
    monitor); a cancel, a stop string or the server closing ends it; its job is settled."""

    def __init__(
        self,
        job: Job[Outcome],
        reply: ReplyStream,
        monitor: EngineMonitor,
        totals: ServedTotals,
        closing: Callable[[], bool],
    ) -> None:
        self.job, self.reply, self.monitor, self.totals, self.closing = job, reply, monitor, totals, closing

    def progress(self, p: Progress) -> None:
        self.monitor.token(p)
        self.totals.token(p)
        self.reply.progress(p)

    def wants_stop(self) -> bool:
        return self.job.cancel_asked or self.reply.stopped or self.closing()

    def done(self, result: RunResult) -> None:
        if self.job.cancel_asked or self.closing():
            self.job.settle(error=RequestCancelledError("the request was cancelled"))
            return
        self.totals.finished(result)
        try:
            self.job.settle(self.reply.finish(result))
        except BaseException as exc:
            self.job.settle(error=exc)

    def failed(self, error: BaseException) -> None:
        self.job.settle(error=error)


def new_id(prefix: str) -> str:
    """A response id: ``chatcmpl-...``, ``cmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex}"
