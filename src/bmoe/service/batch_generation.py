"""Several requests at once: continuous batching over the sequences of one context.

Each request takes a free sequence (a slot), has its prompt prefilled in a decode of its
own, and from then on contributes one token to every step: one ``llama_decode`` holding
the next token of each running sequence (llama.cpp's server does the same). A sequence that
ends (an end-of-generation token, its ``n_predict``) frees its slot at once and the next
waiting request takes it. With experts streamed, a step is one request per MoE layer for
the union of its sequences' experts: each expert is read once per step for all of them.

With ``keep_slots`` (the server's ``-np``), a slot keeps its KV after its request
(``bmoe.domain.slots``): a new request takes the free slot sharing the longest prefix with
its prompt, keeps that prefix and prefills only the rest, so a conversation that comes back
to its slot costs only its new tokens. The memory (``SlotMemory``) outlives the run when the
caller hands it to the next one.

The KV cache is one for all sequences (``n_ctx`` cells): a request is let in only while
the prompts and ``n_predict`` of the running ones, what idle slots still hold and its own
fit in it (idle slots give their cells back, least recently used first, to make room), so
no step can run out of cells. Sampling is per sequence (its own sampler chain, seed and
grammar).
"""

from __future__ import annotations

import codecs
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TokenLogprob
from bmoe.domain.media import is_image_row
from bmoe.domain.prompt_cache import PromptCache, StateTarget
from bmoe.domain.reasoning import ReasoningSplitter
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.slots import DEFAULT_SIMILARITY, SlotChoice, SlotMemory
from bmoe.errors import ContextOverflowError, is_fatal
from bmoe.ports.batch_backend import IBatchBackend


@attrs.frozen
class BatchJob:
    """One request, rendered: its prompt's tokens and how to sample its reply."""

    prompt: tuple[int, ...]
    n_predict: int
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    constraint: OutputConstraint | None = None
    logprobs: int | None = None
    specials: bool = False  # render control tokens as text (tool-call syntaxes use them)


@attrs.frozen
class BatchOutput:
    """What one job produced (its ``text`` split from its ``reasoning``)."""

    text: str
    reasoning: str
    tokens: tuple[int, ...]
    stopped_at_eog: bool
    logprobs: tuple[TokenLogprob, ...]
    prefill_s: float
    decode_s: float
    steps: int  # decode steps this job took part in
    reused: int = 0  # prompt tokens its slot already held (not prefilled)
    restored: int = 0  # of ``reused``, those a state from the prompt cache held
    error: Exception | None = None  # what ended it early (never fatal: ``is_fatal``)


@attrs.define
class _Slot:
    job: int
    seq: int
    spec: BatchJob
    keep: int = 0  # prompt tokens the slot held already
    restored: int = 0  # of ``keep``, the tokens a state from the prompt cache held
    fed: int = 0  # prompt tokens in its memory (a joining slot's grow chunk by chunk)
    tokens: list[int] = attrs.field(factory=list)
    logprobs: list[TokenLogprob] = attrs.field(factory=list)
    text: list[str] = attrs.field(factory=list)
    reasoning: list[str] = attrs.field(factory=list)
    utf8: codecs.IncrementalDecoder = attrs.field(
        factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    splitter: ReasoningSplitter = attrs.field(factory=ReasoningSplitter)
    eog: bool = False
    prefill_s: float = 0.0
    started: float = 0.0
    steps: int = 0
    error: Exception | None = None  # what ended this request alone (its KV is dropped)

    @property
    def cells(self) -> int:
        return len(self.spec.prompt) + self.spec.n_predict

    @property
    def done(self) -> bool:
        return self.eog or len(self.tokens) >= self.spec.n_predict

    @property
    def next_pos(self) -> int:
        """The position of the token it feeds next (its last sampled one)."""
        return len(self.spec.prompt) + len(self.tokens) - 1


OnToken = Callable[[int, int], None]  # (job index, token)


class SlotSink(Protocol):
    """Who follows one job while it runs (the server's reply)."""

    def token(self, token: int, text: str, reasoning: str, logprob: TokenLogprob | None) -> None:
        """A token was generated (with its text and reasoning pieces, its logprob if asked)."""
        ...

    def wants_stop(self) -> bool:
        """The job should end now (a stop string, a cancel): checked after each token."""
        ...


class BatchRun:
    """An online run: ``add`` jobs at any time (between steps), ``step`` until ``idle``.
    Each ``step`` lets in what fits, runs one decode of every running sequence and returns
    the jobs that ended, ``(ticket, output)``. ``close`` frees the samplers."""

    def __init__(
        self,
        backend: IBatchBackend,
        memory: SlotMemory | None = None,
        *,
        keep_slots: bool = False,
        similarity: float = DEFAULT_SIMILARITY,
        chunked: bool = False,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        """``memory``: what the slots hold from an earlier run on the same memory (None:
        nothing; the memory is cleared). ``keep_slots``: slots keep their KV after their
        request and are chosen by ``similarity`` (else each request starts empty and its
        slot is emptied when it ends). ``chunked``: every prompt is prefilled in chunks
        that share the steps of the running sequences and of the other prompts let in (at
        most ``backend.n_batch`` tokens a step, the running sequences' first), so their
        tokens keep coming while it joins, and prompts that arrive together share their
        ubatches (streamed: one pass over the experts for all of them where they fit one
        batch); else each is prefilled in a decode of its own before the next step. ``prompt_cache``
        (with ``keep_slots``): a slot about to lose what it holds (its cells given back, or
        taken by another conversation) keeps its state there first, and a request whose
        prompt extends a kept state more than its slot does restores it into the slot."""
        self.backend = backend
        self.prompt_cache = prompt_cache if keep_slots else None
        self.keep_slots = keep_slots
        self.similarity = similarity
        self.chunked = chunked
        self._joining: list[_Slot] = []
        if memory is None or memory.n_seq != backend.n_seq:
            memory = SlotMemory(backend.n_seq)
            backend.clear()
        self.memory = memory
        self._waiting: deque[tuple[int, BatchJob, SlotSink | None]] = deque()
        self._free = list(range(backend.n_seq))
        self._running: list[_Slot] = []
        self._sinks: dict[int, SlotSink] = {}
        self._tickets = 0

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running and not self._joining

    @property
    def running(self) -> int:
        """Sequences in a slot: generating, or their prompt joining."""
        return len(self._running) + len(self._joining)

    def add(self, job: BatchJob, sink: SlotSink | None = None) -> int:
        """Queue ``job``; its ticket. Raises ``ContextOverflowError`` (nothing queued) when
        it cannot fit alone."""
        if not job.prompt:
            raise ContextOverflowError("the prompt tokenizes to nothing")
        if _cells(job) > self.backend.n_ctx:
            raise ContextOverflowError(
                f"prompt ({len(job.prompt)} tokens) + n_predict ({job.n_predict}) "
                f"exceeds the context of {self.backend.n_ctx} tokens"
            )
        ticket = self._tickets
        self._tickets += 1
        self._waiting.append((ticket, job, sink))
        return ticket

    def step(self) -> list[tuple[int, BatchOutput]]:
        ended: list[tuple[int, BatchOutput]] = []
        backend = self.backend
        while self._waiting and self._free:
            ticket, job, sink = self._waiting[0]
            if sink is not None and sink.wants_stop():  # cancelled while it waited: never runs
                self._waiting.popleft()
                ended.append((ticket, _unrun()))
                continue
            choice = self._choose(job)
            if choice is None:
                break  # no room yet: it waits for a running one to end
            self._waiting.popleft()
            self._free.remove(choice.seq)
            slot = _Slot(ticket, choice.seq, job, keep=choice.keep)
            if sink is not None:
                self._sinks[ticket] = sink
            self._alone(slot, self._prepare, slot)
            if slot.error is None:
                self._alone(slot, _claim, backend, slot, self.memory)
            # prefilled in chunks beside the others (a prompt with images alone: an image's
            # rows are embeddings, which no step of tokens can hold)
            if self.chunked and slot.error is None and not any(is_image_row(t) for t in job.prompt):
                self._joining.append(slot)
                continue
            if slot.error is None:
                self._alone(slot, _prefill, backend, slot, self._sink(slot))
            if self._ends(slot):
                ended.append((ticket, self._end(slot)))
            else:
                self._running.append(slot)
        for slot in [s for s in self._joining if self._cancelled(s)]:  # while it joined
            self._joining.remove(slot)
            ended.append((slot.job, self._end(slot)))
        if self._running or self._joining:
            ended += self._step()
        return ended

    def _step(self) -> list[tuple[int, BatchOutput]]:
        """One decode: a token of every running sequence, then as much of the joining
        prompts as the step's room holds (``n_batch``); the sequences whose prompt is in
        then draw their first token and run."""
        backend = self.backend
        entries = [(s.tokens[-1], s.next_pos, s.seq) for s in self._running]
        outputs = [True] * len(entries)
        room = max(1, backend.n_batch - len(entries)) if self._joining else 0
        joined: list[tuple[_Slot, int]] = []
        now = time.perf_counter()
        for slot in list(self._joining):
            prompt, take = slot.spec.prompt, min(room, len(slot.spec.prompt) - slot.fed)
            if take <= 0:
                break
            if slot.fed == slot.keep:
                slot.started = now  # its prefill starts
            entries += [(prompt[p], p, slot.seq) for p in range(slot.fed, slot.fed + take)]
            outputs += [False] * take
            slot.fed += take
            room -= take
            if slot.fed == len(prompt):
                outputs[-1] = True
                joined.append((slot, len(entries) - 1))
        backend.step(entries, outputs, n_decode=len(self._running))
        ended: list[tuple[int, BatchOutput]] = []
        for row, slot in enumerate(self._running):
            slot.steps += 1
            self._alone(slot, _take, backend, slot, row, self._sink(slot))
        for slot in [s for s in self._running if self._ends(s)]:
            self._running.remove(slot)
            ended.append((slot.job, self._end(slot)))
        for slot, row in joined:
            self._joining.remove(slot)
            slot.prefill_s = time.perf_counter() - slot.started
            slot.started = time.perf_counter()
            if slot.spec.n_predict > 0:
                self._alone(slot, _take, backend, slot, row, self._sink(slot))
            if self._ends(slot):
                ended.append((slot.job, self._end(slot)))
            else:
                self._running.append(slot)
        return ended

    def _choose(self, job: BatchJob) -> SlotChoice | None:
        """The slot ``job`` takes and what of it to keep, once there is room for it: idle
        slots give back what they hold, least recently used first; None while the running
        ones leave too little."""
        if self.keep_slots:
            choice = self.memory.pick(job.prompt, self._free, self.similarity)
        else:
            choice = SlotChoice(self._free[0], 0)
        running = sum(s.cells for s in (*self._running, *self._joining))
        if running + _cells(job) > self.backend.n_ctx:
            return None  # even with every idle slot emptied: nothing is given back for nothing
        idle = [seq for seq in self._free if seq != choice.seq]
        for victim in [None, *self.memory.to_drop(idle)]:
            if victim is not None:
                self._keep_state(victim)
                self.backend.drop(victim)
                self.memory.forget(victim)
            if running + _cells(job) + self.memory.cells(idle) <= self.backend.n_ctx:
                return choice
        return None

    def _sink(self, slot: _Slot) -> SlotSink | None:
        return self._sinks.get(slot.job)

    def _keep_state(self, seq: int) -> None:
        """Keep what ``seq`` holds in the prompt cache (if any, and not kept already)."""
        held, cache = self.memory.held[seq], self.prompt_cache
        if cache is None or not held or cache.holds(held):
            return
        blob = self.backend.save_state(seq)
        if blob is not None:
            cache.store(held, blob)

    def _prepare(self, slot: _Slot) -> None:
        """Before ``slot`` starts, with a prompt cache: what the slot holds goes to the cache
        if the slot is to lose some of it, and a kept state the prompt extends further than
        the slot holds goes into the slot."""
        cache = self.prompt_cache
        if cache is None:
            return
        if slot.keep < len(self.memory.held[slot.seq]):
            self._keep_state(slot.seq)
        found = cache.lookup(slot.spec.prompt, better_than=slot.keep)
        if found is None:
            return
        backend, seq = self.backend, slot.seq
        target = StateTarget(
            lambda blob: backend.load_state(seq, blob),
            lambda n: backend.keep(seq, n) is True,
            lambda: backend.drop(seq),
        )
        done = cache.restore(found, slot.spec.prompt, target)
        if done is not None:
            self.memory.hold(seq, done.kept.tokens[: done.shared])
            slot.keep = slot.restored = done.shared
        else:  # the slot is empty now
            self.memory.forget(seq)
            slot.keep = 0

    def _cancelled(self, slot: _Slot) -> bool:
        sink = self._sinks.get(slot.job)
        return sink is not None and sink.wants_stop()

    def _ends(self, slot: _Slot) -> bool:
        sink = self._sinks.get(slot.job)
        return slot.done or slot.error is not None or (sink is not None and sink.wants_stop())

    def _end(self, slot: _Slot) -> BatchOutput:
        self._sinks.pop(slot.job, None)
        if slot.error is not None:  # its KV dropped, its slot free: the others run on
            self.backend.drop(slot.seq)
            self.memory.forget(slot.seq)
            self._free = sorted([*self._free, slot.seq])
            return BatchOutput(
                "", "", tuple(slot.tokens), False, (), slot.prefill_s, 0.0, slot.steps, error=slot.error
            )
        return _finish(self.backend, slot, self._free, self.memory, keep=self.keep_slots)

    @staticmethod
    def _alone(slot: _Slot, work: Callable[..., object], *args: Any) -> None:
        """Run ``work(*args)`` for ``slot``: an error that is not fatal (its constraint dead-ending,
        ``is_fatal``) ends this request only (kept in ``slot.error``); a fatal one ends the run."""
        try:
            work(*args)
        except Exception as exc:
            if is_fatal(exc):
                raise
            slot.error = exc

    def close(self) -> None:
        self.backend.close_samplers()


def run_batch(
    backend: IBatchBackend, jobs: Sequence[BatchJob], on_token: OnToken | None = None
) -> list[BatchOutput]:
    """Answer every job, up to ``backend.n_seq`` at a time; the outputs in the jobs' order.
    Raises ``ContextOverflowError`` (nothing computed) when a job alone does not fit."""
    run = BatchRun(backend)
    outputs: dict[int, BatchOutput] = {}
    try:
        for i, job in enumerate(jobs):
            try:
                run.add(job, _Counting(i, on_token) if on_token is not None else None)
            except ContextOverflowError as exc:
                raise ContextOverflowError(f"request {i}: {exc}") from None
        while not run.idle:
            outputs.update(run.step())
    finally:
        run.close()
    for out in outputs.values():
        if out.error is not None:
            raise out.error  # that request's error: the others' results are lost with it
    return [outputs[i] for i in range(len(jobs))]


@attrs.define
class _Counting:
    index: int
    on_token: OnToken

    def token(self, token: int, text: str, reasoning: str, logprob: TokenLogprob | None) -> None:
        self.on_token(self.index, token)

    def wants_stop(self) -> bool:
        return False


def _unrun() -> BatchOutput:
    return BatchOutput("", "", (), False, (), 0.0, 0.0, 0)


def _cells(job: BatchJob) -> int:
    return len(job.prompt) + job.n_predict


def _claim(backend: IBatchBackend, slot: _Slot, memory: SlotMemory) -> None:
    """The slot's sampler, and its memory cut to the prefix it keeps."""
    backend.start_sampling(slot.seq, slot.spec.sampling, slot.spec.constraint)
    if slot.keep > 0 and not backend.keep(slot.seq, slot.keep):
        slot.keep = 0  # the memory cannot keep a part (recurrent, a pruned window)
    if slot.keep == 0 and memory.held[slot.seq]:
        backend.drop(slot.seq)
    memory.hold(slot.seq, slot.spec.prompt)
    slot.fed = slot.keep


def _prefill(backend: IBatchBackend, slot: _Slot, sink: SlotSink | None) -> None:
    """Prefill the rest of the slot's prompt in a decode of its own, and draw its first token."""
    t0 = time.perf_counter()
    backend.prefill(slot.seq, slot.spec.prompt[slot.keep :], slot.keep)
    slot.fed = len(slot.spec.prompt)
    slot.prefill_s = time.perf_counter() - t0
    slot.started = time.perf_counter()
    if slot.spec.n_predict > 0:
        _take(backend, slot, -1, sink)


def _take(backend: IBatchBackend, slot: _Slot, row: int, sink: SlotSink | None) -> None:
    """Draw the slot's next token from output ``row`` and record it (an end-of-generation
    token ends the slot and is not kept, as a single generation does)."""
    token = backend.sample(slot.seq, row)
    if backend.is_eog(token):
        slot.eog = True
        return
    slot.tokens.append(token)
    logprob = None
    if slot.spec.logprobs is not None:
        logprob = backend.token_logprob(row, token, slot.spec.logprobs)
        slot.logprobs.append(logprob)
    delta = slot.splitter.feed(slot.utf8.decode(backend.token_bytes(token, special=slot.spec.specials)))
    slot.text.append(delta.text)
    slot.reasoning.append(delta.reasoning)
    if sink is not None:
        sink.token(token, delta.text, delta.reasoning, logprob)


def _finish(
    backend: IBatchBackend, slot: _Slot, free: list[int], memory: SlotMemory, *, keep: bool
) -> BatchOutput:
    """End ``slot``: with ``keep``, its slot keeps its prompt, and its reply's cells are cut
    off where the memory can cut (the reply's tokens were computed one per step, and the
    next turn's prompt computes them in a batch as a fresh server would: keeping them would
    answer that turn with log-probabilities off in their last bits); where it cannot (a
    recurrent state), the prompt and the reply but its last token (sampled, never decoded);
    where the cut left nothing usable (a pruned sliding window), nothing. Without ``keep``,
    its KV is dropped."""
    for delta in (slot.splitter.feed(slot.utf8.decode(b"", final=True)), slot.splitter.finish()):
        slot.text.append(delta.text)
        slot.reasoning.append(delta.reasoning)
    prompt = slot.spec.prompt[: slot.fed]
    cut = backend.keep(slot.seq, len(prompt)) if keep and slot.steps else False
    if keep and cut:
        memory.hold(slot.seq, prompt)
    elif keep and cut is False:
        memory.hold(slot.seq, (*prompt, *slot.tokens[: slot.steps]))
    else:
        backend.drop(slot.seq)
        memory.forget(slot.seq)
    free.append(slot.seq)
    free.sort()
    return BatchOutput(
        text="".join(slot.text),
        reasoning="".join(slot.reasoning),
        tokens=tuple(slot.tokens),
        stopped_at_eog=slot.eog,
        logprobs=tuple(slot.logprobs),
        prefill_s=slot.prefill_s,
        decode_s=time.perf_counter() - slot.started,
        steps=slot.steps,
        reused=slot.keep,
        restored=slot.restored,
    )
