"""The ``--session`` loop: JSON requests on stdin, ``BMOE_*`` lines on stdout.

A thin loop around the sans-I/O protocol core (``bmoe.adapters.protocol``): a reader
thread turns stdin into request events, acting on ``cancel`` at once (so it reaches a
generate in flight) and queueing everything else in order; the main thread serves the
queue one request at a time.

A ``cancel`` without an ``id`` stops whatever runs. One with an ``id`` stops the request in
flight when it has that id, or marks the first queued request with that id, which then ends
cancelled as soon as it begins; an id that is finished or unknown changes nothing.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import BinaryIO

from bmoe.adapters.protocol import (
    BadRequest,
    Begin,
    CancelCmd,
    CloseCmd,
    DecideCmd,
    DecideDone,
    Done,
    DoneLogprob,
    DoneToolCall,
    EndOfInput,
    Error,
    GenerateCmd,
    Progress,
    ProgressBudgetChange,
    ReaderEvent,
    Ready,
    RequestId,
    RequestReader,
    Response,
    encode_response,
)
from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.generation import Progress as TokenProgress
from bmoe.domain.media.references import INLINE_MEDIA
from bmoe.domain.metrics import run_summary
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import MIB
from bmoe.domain.streaming.governor import BudgetChange
from bmoe.errors import BmoeError, is_fatal
from bmoe.requests.image_parts import image_list
from bmoe.runtime import Session

_STOP = object()
_IDLE = object()  # no request in flight


class SessionLoop:
    """Serve one session over a pair of byte streams until ``close`` or end of input."""

    def __init__(
        self,
        session: Session,
        stdin: BinaryIO,
        stdout: BinaryIO,
        *,
        progress: bool,
        sampling: SamplingParams | None = None,
    ) -> None:
        """``sampling``: how every generate of this session samples (greedy by default)."""
        self.session = session
        self.stdin = stdin
        self.stdout = stdout
        self.progress = progress
        self.sampling = sampling or SamplingParams()
        self._out = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        # cancel by id: the reader thread and the main thread share these under _ids
        self._ids = threading.Lock()
        self._in_flight: object = _IDLE  # the id of the request that began and has not ended
        self._queued: Counter[RequestId] = Counter()  # ids of requests queued, not yet begun
        self._cancel_on_begin: Counter[RequestId] = Counter()  # queued ids already cancelled
        self._changes_sent = 0  # the governor's budget changes already on a BMOE_PROGRESS line
        self._stopping = False

    def send(self, response: Response) -> None:
        with self._out:
            self.stdout.write(encode_response(response))
            self.stdout.flush()

    def stop(self) -> None:
        """Serve no more (any thread but the serving one; a signal's): the request in flight
        is cancelled, the queued ones are dropped, ``run`` returns 0."""
        self._stopping = True
        self.session.cancel()
        self._queue.put(_STOP)

    # -- input (reader thread) -------------------------------------------------------------

    def _read(self) -> None:
        reader = RequestReader()
        fd = self.stdin.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                events = reader.feed(chunk) if chunk else reader.feed_eof()
                for event in events:
                    if not self._dispatch(event):
                        return
                if not chunk:
                    return
        finally:
            self._queue.put(_STOP)

    def _dispatch(self, event: ReaderEvent) -> bool:
        """Route one event; False once input should stop being read."""
        if isinstance(event, CancelCmd):
            self._cancel(event.id)
            return True
        if isinstance(event, CloseCmd | EndOfInput):
            return False
        if isinstance(event, GenerateCmd | DecideCmd) and event.id is not None:
            with self._ids:
                self._queued[event.id] += 1
        self._queue.put(event)
        return True

    def _cancel(self, rid: RequestId) -> None:
        """A ``cancel``: of whatever runs (no id), else of the request with that id, in
        flight or queued; nothing for an id that is finished or unknown."""
        with self._ids:
            if rid is None or self._in_flight == rid:
                self.session.cancel()  # ignored when nothing is in flight
            elif self._queued[rid] > self._cancel_on_begin[rid]:
                self._cancel_on_begin[rid] += 1

    def _begin(self, rid: RequestId) -> None:
        """The request ``rid`` is in flight (the session now acts on ``cancel()``)."""
        with self._ids:
            self._in_flight = rid
            if self._unqueue(rid):
                self.session.cancel()
        self.send(Begin(id=rid))

    def _end(self, rid: RequestId) -> None:
        """The request ``rid`` ended; one refused before it began is unqueued now."""
        with self._ids:
            if self._in_flight is _IDLE:
                self._unqueue(rid)
            self._in_flight = _IDLE

    def _unqueue(self, rid: RequestId) -> bool:
        """Take ``rid`` off the queued ids (under ``_ids``); True if it was cancelled there."""
        if rid is None:
            return False
        self._queued[rid] -= 1
        if self._queued[rid] <= 0:
            del self._queued[rid]
        cancelled = self._cancel_on_begin[rid] > 0
        self._cancel_on_begin[rid] -= 1
        if self._cancel_on_begin[rid] <= 0:
            del self._cancel_on_begin[rid]
        return cancelled

    # -- serving (main thread) -------------------------------------------------------------

    def run(self) -> int:
        """Announce ``BMOE_READY``, serve, return the process exit status."""
        s = self.session
        self.send(
            Ready(
                load_s=s.load_s,
                arch=s.arch,
                n_ctx=s.n_ctx,
                n_expert_used=s.n_expert_used,
                think_ctl=s.think_ctl,
                repacked=s.weight_layout.repacked,
                weights=s.weight_layout.summary(),
                placement=s.placement_line,
            )
        )
        threading.Thread(target=self._read, name="bmoe-stdin", daemon=True).start()
        while True:
            event = self._queue.get()
            if event is _STOP or self._stopping:
                return 0
            if not self._serve(event):
                return 1

    def _serve(self, event: object) -> bool:
        """Answer one request; False after a fatal error."""
        if isinstance(event, BadRequest):
            self.send(Error(id=event.id, fatal=False, msg=event.msg))
        elif isinstance(event, GenerateCmd):
            return self._answer(event.id, lambda: self._generate(event))
        elif isinstance(event, DecideCmd):
            return self._answer(event.id, lambda: self._decide(event))
        return True

    def _answer(self, rid: RequestId, work: Callable[[], Response]) -> bool:
        """Send what ``work`` answers, or its error: fatal when ``is_fatal`` says the
        engine is broken, else this request's only (a refusal, a constraint that dead-ends).
        False after a fatal one."""
        try:
            try:
                response = work()
            finally:
                self._end(rid)
        except BmoeError as exc:
            fatal = is_fatal(exc)
            self.send(Error(id=rid, fatal=fatal, msg=str(exc)))
            return not fatal
        self.send(response)
        return True

    def _decide(self, cmd: DecideCmd) -> Response:
        request = DecideRequest(
            prefix=cmd.prefix,
            suffix=cmd.suffix,
            choices=cmd.choices,
            reuse_prefix=cmd.reuse_prefix,
            images=image_list(cmd.images, INLINE_MEDIA),
        )
        result = self.session.decide(request, on_begin=lambda: self._begin(cmd.id))
        return decide_response(cmd.id, result)

    def _budget_changes(self) -> list[BudgetChange]:
        """The governor's budget changes not yet on a ``BMOE_PROGRESS`` line (the governor's
        thread appends to ``changes``; this takes what is there now)."""
        governor = self.session.governor
        if governor is None:
            return []
        news = governor.changes[self._changes_sent :]
        self._changes_sent += len(news)
        return news

    def _generate(self, cmd: GenerateCmd) -> Response:
        def on_progress(p: TokenProgress) -> None:
            if self.progress:
                self.send(progress_response(p, self._budget_changes()))

        request = GenerateRequest(
            prompt=cmd.prompt,
            n_predict=cmd.n_predict,
            think=cmd.think,
            clear_kv=cmd.clear_kv,
            sampling=self.sampling,
            constraint=cmd.constraint(),
            tools=cmd.tool_use(),
            logprobs=cmd.logprobs,
            conversation=cmd.conversation,
            images=image_list(cmd.images, INLINE_MEDIA),
        )
        result = self.session.generate(request, on_progress, on_begin=lambda: self._begin(cmd.id))
        return done_response(cmd.id, result, self.session.load_s)


def progress_response(p: TokenProgress, budget_changes: Sequence[BudgetChange] = ()) -> Progress:
    """``BMOE_PROGRESS`` for one token (streaming figures -1 when not streaming), with the
    governor's ``budget_changes`` since the previous line."""
    if p.stream is None:
        return Progress(
            step=p.step,
            steps=p.steps,
            wall_ms=p.wall_ms,
            delta_text=p.delta_text,
            delta_reasoning=p.delta_reasoning,
        )
    io_ms = p.stream.io_s * 1000.0
    mgmt_ms = p.stream.mgmt_s * 1000.0
    stall_ms = p.stream.stall_s * 1000.0
    return Progress(
        step=p.step,
        steps=p.steps,
        wall_ms=p.wall_ms,
        io_ms=io_ms,
        compute_ms=max(0.0, p.wall_ms - stall_ms - mgmt_ms),
        mgmt_ms=mgmt_ms,
        stall_ms=stall_ms,
        read_mb=p.stream.bytes_read / 1e6,
        cache_hit_pct=p.stream.hit_pct,
        delta_text=p.delta_text,
        delta_reasoning=p.delta_reasoning,
        cache_resident_mib=p.stream.resident_bytes / MIB,
        cache_budget_mib=p.stream.budget_bytes / MIB,
        budget_changes=tuple(
            ProgressBudgetChange(from_mib=c.before / MIB, to_mib=c.after / MIB, why=c.why)
            for c in budget_changes
        ),
    )


def done_response(rid: RequestId, result: RunResult, load_s: float) -> Done:
    """``BMOE_DONE`` for one generate: ``run_summary``'s figures (streaming ones -1 when not
    streaming) and the content."""
    return Done(
        id=rid,
        **run_summary(result, load_s),
        text=result.text,
        reasoning=result.reasoning,
        tool_calls=tuple(
            DoneToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in result.tool_calls
        ),
        logprobs=tuple(
            DoneLogprob(
                token=lp.chosen.token,
                text=lp.chosen.piece,
                logprob=lp.chosen.logprob,
                top=tuple((t.token, t.logprob) for t in lp.top),
            )
            for lp in result.logprobs
        ),
    )


def decide_response(rid: RequestId, result: DecideResult) -> DecideDone:
    """``BMOE_DECIDE`` for one decision (streaming figures -1 when not streaming)."""
    extra = {}
    if result.stream is not None:
        extra = {
            "prefill_read_mib": result.stream.read_mib,
            "prefill_io_s": result.stream.io_s,
            "prefill_stall_s": result.stream.stall_s,
        }
    return DecideDone(
        id=rid,
        cancelled=result.cancelled,
        best=result.best,
        choice_logp=result.choice_logp,
        **result.prompt_figures(),
        prefix_state_mib=result.prefix_state_mib,
        choice_p_renorm=tuple(float(p) for p in result.choice_p_renorm),
        prefix_plan=result.prefix_plan,
        **extra,
    )
