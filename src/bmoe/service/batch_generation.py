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

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from bmoe.domain.generation import TokenLogprob
from bmoe.domain.media import is_image_row
from bmoe.domain.prompt_cache import PromptCache, StateTarget
from bmoe.domain.slots import DEFAULT_SIMILARITY, SlotChoice, SlotMemory
from bmoe.errors import ContextOverflowError, is_fatal
from bmoe.ports.batch_backend import IBatchBackend
from bmoe.service.batch_slot import BatchJob, BatchOutput, Slot, SlotSink, claim, draw, finish, prefill

__all__ = ["BatchJob", "BatchOutput", "BatchRun", "OnToken", "SlotSink", "run_batch"]

OnToken = Callable[[int, int], None]  # (job index, token)


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
        self._joining: list[Slot] = []
        if memory is None or memory.n_seq != backend.n_seq:
            memory = SlotMemory(backend.n_seq)
            backend.clear()
        self.memory = memory
        self._waiting: deque[tuple[int, BatchJob, SlotSink | None]] = deque()
        self._free = list(range(backend.n_seq))
        self._running: list[Slot] = []
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
            slot = Slot(ticket, choice.seq, job, keep=choice.keep)
            if sink is not None:
                self._sinks[ticket] = sink
            self._alone(slot, self._prepare, slot)
            if slot.error is None:
                self._alone(slot, claim, backend, slot, self.memory)
            # prefilled in chunks beside the others (a prompt with images alone: an image's
            # rows are embeddings, which no step of tokens can hold)
            if self.chunked and slot.error is None and not any(is_image_row(t) for t in job.prompt):
                self._joining.append(slot)
                continue
            if slot.error is None:
                self._alone(slot, prefill, backend, slot, self._sink(slot))
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
        joined: list[tuple[Slot, int]] = []
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
            self._alone(slot, draw, backend, slot, row, self._sink(slot))
        for slot in [s for s in self._running if self._ends(s)]:
            self._running.remove(slot)
            ended.append((slot.job, self._end(slot)))
        for slot, row in joined:
            self._joining.remove(slot)
            slot.prefill_s = time.perf_counter() - slot.started
            slot.started = time.perf_counter()
            if slot.spec.n_predict > 0:
                self._alone(slot, draw, backend, slot, row, self._sink(slot))
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

    def _sink(self, slot: Slot) -> SlotSink | None:
        return self._sinks.get(slot.job)

    def _keep_state(self, seq: int) -> None:
        """Keep what ``seq`` holds in the prompt cache (if any, and not kept already)."""
        held, cache = self.memory.held[seq], self.prompt_cache
        if cache is None or not held or cache.holds(held):
            return
        blob = self.backend.save_state(seq)
        if blob is not None:
            cache.store(held, blob)

    def _prepare(self, slot: Slot) -> None:
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

    def _cancelled(self, slot: Slot) -> bool:
        sink = self._sinks.get(slot.job)
        return sink is not None and sink.wants_stop()

    def _ends(self, slot: Slot) -> bool:
        sink = self._sinks.get(slot.job)
        return slot.done or slot.error is not None or (sink is not None and sink.wants_stop())

    def _end(self, slot: Slot) -> BatchOutput:
        self._sinks.pop(slot.job, None)
        if slot.error is not None:  # its KV dropped, its slot free: the others run on
            self.backend.drop(slot.seq)
            self.memory.forget(slot.seq)
            self._free = sorted([*self._free, slot.seq])
            return BatchOutput(
                "", "", tuple(slot.tokens), False, (), slot.prefill_s, 0.0, slot.steps, error=slot.error
            )
        return finish(self.backend, slot, self._free, self.memory, keep=self.keep_slots)

    @staticmethod
    def _alone(slot: Slot, work: Callable[..., object], *args: Any) -> None:
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
