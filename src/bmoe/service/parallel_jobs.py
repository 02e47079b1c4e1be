"""Requests as parallel sequences: ``Session.generate_batch`` and ``Session.run_parallel``.

``ParallelJobs`` turns a ``GenerateRequest`` into a ``BatchJob`` (its prompt rendered by the
session's engine, alone or after the history it carries) and a ``BatchOutput`` back into a
``RunResult`` (tool calls parsed from the reply, as ``SessionEngine`` parses a single
reply's), and runs them over an ``IBatchBackend`` (``bmoe.service.batch_generation``) as a
request in flight of the session's engine: all of them at once (``generate_batch``), or as
they come, each followed by its ``ParallelSink`` (``run_parallel``, the server's ``-np``).
Between runs it keeps what the slots hold (``memory``); each step tells the streamer, when
there is one (``DecodeRows``), how many sequences it holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult, TokenLogprob
from bmoe.domain.prompt_cache import PromptCache
from bmoe.domain.slots import DEFAULT_SIMILARITY, SlotMemory
from bmoe.domain.tools import ToolCall, ToolUse, parse_reply
from bmoe.errors import ConfigError
from bmoe.ports.batch_backend import IBatchBackend
from bmoe.service.batch_generation import BatchJob, BatchOutput, BatchRun, run_batch
from bmoe.service.session_engine import SessionEngine


class ParallelSink(Protocol):
    """Who follows one request of ``Session.run_parallel`` (the server's reply)."""

    def progress(self, p: Progress) -> None: ...

    def wants_stop(self) -> bool: ...

    def done(self, result: RunResult) -> None: ...

    def failed(self, error: BaseException) -> None: ...


@attrs.frozen
class ParallelEntry:
    """A request for ``run_parallel``: ``history`` the conversation before it (chat)."""

    request: GenerateRequest
    sink: ParallelSink
    chat: bool = True
    history: Sequence[ChatMessage] | None = None


T = TypeVar("T")
OnStep = Callable[[int], None]
"""Told before each decode of a run how many sequences it holds (1: a prefill)."""


class DecodeRows(Protocol):
    """The streamer's side of a run (``StreamingControl`` is one)."""

    def set_decode_rows(self, n: int) -> None:
        """The next decodes hold ``n`` sequences' tokens."""
        ...

    def end_turn(self) -> None:
        """A request ended (its figures and traces are closed)."""
        ...


Take = Callable[[bool], Sequence[ParallelEntry]]
"""``take(idle)``: the entries that came since the last step (``idle``: nothing runs or waits)."""


@attrs.define
class _Following:
    """A batch slot's tokens as a ``ParallelSink`` hears them (``Progress``)."""

    sink: ParallelSink
    steps: int
    _step: int = 0
    _last: float = attrs.field(factory=time.perf_counter)

    def token(self, token: int, text: str, reasoning: str, logprob: TokenLogprob | None) -> None:
        now = time.perf_counter()
        self._step += 1
        wall_ms, self._last = (now - self._last) * 1000.0, now
        self.sink.progress(Progress(self._step, self.steps, wall_ms, text, reasoning, logprob=logprob))

    def wants_stop(self) -> bool:
        return self.sink.wants_stop()


@attrs.define
class ParallelJobs:
    """One session's parallel sequences: ``engine`` renders the requests and serialises the
    runs with its other requests, ``n_predict`` is the session's default, ``similarity`` and
    ``prompt_cache`` how slots are reused; ``new_backend(on_step)`` a batch backend over the
    session's context, ``rows`` the streamer (None: resident), ``after`` what follows a
    streamed run that ended well (the usage profile learns). ``peak`` is the most sequences
    one step held, ``running`` those the last step held (0 between runs)."""

    engine: SessionEngine
    n_predict: int
    new_backend: Callable[[OnStep], IBatchBackend]
    similarity: float = DEFAULT_SIMILARITY
    prompt_cache: PromptCache | None = None
    rows: DecodeRows | None = None
    after: Callable[[], None] | None = None
    memory: SlotMemory | None = None  # what the slots hold between runs; None: nothing kept
    peak: int = 0
    running: int = 0

    def generate_batch(self, requests: Sequence[GenerateRequest], chat: bool) -> list[RunResult]:
        """Every request alone (rendered now: a ``ConfigError`` before anything runs), up to
        ``n_seq`` at a time; the results in the requests' order. The context is left empty."""
        self.memory = None
        jobs = [self.job(r, chat) for r in requests]
        return self.run(lambda backend: self.answer(backend, requests, jobs, chat))

    def run_parallel(self, take: Take) -> None:
        """``serve`` as one run, the slots starting from what the last run left them."""

        def work(backend: IBatchBackend) -> None:
            memory, self.memory = self.memory, None  # unknown if the run fails
            self.memory = self.serve(backend, take, memory)  # kept for the next run

        self.run(work, keep=True)

    def run(self, work: Callable[[IBatchBackend], T], *, keep: bool = False) -> T:
        """``work`` on a new batch backend, as a request in flight (serialised with
        ``generate``; the conversation's KV is forgotten): each step tells ``rows`` how many
        sequences it holds; after it, the context is empty again, unless ``keep`` (the slots
        keep their KV where the work left ``memory``)."""
        rows = self.rows

        def on_step(n: int) -> None:
            self.peak = max(self.peak, n)
            self.running = n
            if rows is not None:
                rows.set_decode_rows(n)

        backend = self.new_backend(on_step)
        try:
            result = self.engine.run_exclusive(lambda: work(backend))
        finally:
            self.running = 0
            if rows is not None:
                rows.set_decode_rows(1)
                rows.end_turn()
            if not keep or self.memory is None:
                self.memory = None
                backend.clear()
        if rows is not None and self.after is not None:
            self.after()
        return result

    def job(
        self, request: GenerateRequest, chat: bool, history: Sequence[ChatMessage] | None = None
    ) -> BatchJob:
        """``request`` rendered alone (after ``history`` in chat): ``ConfigError`` when it
        cannot be (a template that refuses it, a schema bmoe cannot enforce)."""
        alone = attrs.evolve(request, clear_kv=True)
        prompt = self.engine.render_prompt(alone, history=(history or []) if chat else None, chat=chat)
        n_predict = self.n_predict if request.n_predict is None else request.n_predict
        return BatchJob(
            prompt=tuple(prompt),
            n_predict=n_predict,
            sampling=request.sampling,
            constraint=self.engine.constraint(request),
            logprobs=request.logprobs,
            specials=ToolUse.shown(request.tools) is not None,
        )

    def result(self, request: GenerateRequest, job: BatchJob, out: BatchOutput, chat: bool) -> RunResult:
        """What ``job`` produced as ``request``'s ``RunResult``: tool calls parsed where the
        request showed tools (a reply cut by ``n_predict`` parsed as cut)."""
        text, reasoning = out.text, out.reasoning
        calls: tuple[ToolCall, ...] = ()
        tools = ToolUse.shown(request.tools) if chat else None
        fmt = self.engine.renderer.tool_format
        if tools is not None and fmt is not None:
            cut = not out.stopped_at_eog and len(out.tokens) >= job.n_predict
            reply = parse_reply(fmt, out.text, parallel=tools.parallel, cut=cut)
            text, calls, reasoning = reply.content, reply.calls, reasoning + reply.reasoning
        return RunResult(
            text=text,
            reasoning=reasoning,
            tokens=out.tokens,
            n_prompt=len(job.prompt) - out.reused,
            n_restored=out.restored,
            n_past=len(job.prompt) + len(out.tokens),
            prefill_s=out.prefill_s,
            decode_s=out.decode_s,
            stopped_at_eog=out.stopped_at_eog,
            tool_calls=calls,
            logprobs=out.logprobs,
        )

    def answer(
        self,
        backend: IBatchBackend,
        requests: Sequence[GenerateRequest],
        jobs: Sequence[BatchJob],
        chat: bool,
    ) -> list[RunResult]:
        """Run ``jobs`` (``requests`` rendered by ``job``) to the end; the results in order."""
        outputs = run_batch(backend, list(jobs))
        return [self.result(r, job, out, chat) for r, job, out in zip(requests, jobs, outputs, strict=True)]

    def serve(self, backend: IBatchBackend, take: Take, memory: SlotMemory | None) -> SlotMemory:
        """Run entries as ``take`` hands them over until it hands none while idle; each
        entry's sink hears its tokens and gets its result, or the error that refused or
        ended it alone (``ConfigError``, a constraint that dead-ends: not ``is_fatal``; the
        others run on) or ended the run (every live sink hears it, then
        it is raised). The slots start from ``memory``; what they hold at the end is returned,
        for the next run (none when the run fails: the caller must empty the context)."""
        run = BatchRun(
            backend,
            memory,
            keep_slots=True,
            similarity=self.similarity,
            chunked=True,
            prompt_cache=self.prompt_cache,
        )
        live: dict[int, tuple[ParallelEntry, BatchJob]] = {}
        try:
            while True:
                entries = take(run.idle)
                for entry in entries:
                    try:
                        job = self.job(entry.request, entry.chat, entry.history)
                        ticket = run.add(job, _Following(entry.sink, job.n_predict))
                    except ConfigError as exc:
                        entry.sink.failed(exc)
                        continue
                    live[ticket] = (entry, job)
                if run.idle and not entries:  # ``take`` handed none while idle: it knows the run ends
                    return run.memory  # the slots keep their KV for the next run
                for ticket, out in run.step():
                    entry, job = live.pop(ticket)
                    if out.error is not None:  # this request's own (its KV dropped, its slot free)
                        entry.sink.failed(out.error)
                    else:
                        entry.sink.done(self.result(entry.request, job, out, entry.chat))
        except BaseException as exc:
            for entry, _ in live.values():
                entry.sink.failed(exc)
            raise
        finally:
            run.close()
