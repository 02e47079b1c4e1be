"""One request's sequence in a batch: the job it was rendered into, the slot's state while
it runs, its prompt prefilled alone, its tokens drawn, and its end (what its slot keeps,
the ``BatchOutput`` it becomes). ``BatchRun`` (``batch_generation``) schedules the slots.
"""

from __future__ import annotations

import codecs
import time
from typing import Protocol

import attrs

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TokenLogprob
from bmoe.domain.reasoning import ReasoningSplitter
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.slots import SlotMemory
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
class Slot:
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


class SlotSink(Protocol):
    """Who follows one job while it runs (the server's reply)."""

    def token(self, token: int, text: str, reasoning: str, logprob: TokenLogprob | None) -> None:
        """A token was generated (with its text and reasoning pieces, its logprob if asked)."""
        ...

    def wants_stop(self) -> bool:
        """The job should end now (a stop string, a cancel): checked after each token."""
        ...


def claim(backend: IBatchBackend, slot: Slot, memory: SlotMemory) -> None:
    """The slot's sampler, and its memory cut to the prefix it keeps."""
    backend.start_sampling(slot.seq, slot.spec.sampling, slot.spec.constraint)
    if slot.keep > 0 and not backend.keep(slot.seq, slot.keep):
        slot.keep = 0  # the memory cannot keep a part (recurrent, a pruned window)
    if slot.keep == 0 and memory.held[slot.seq]:
        backend.drop(slot.seq)
    memory.hold(slot.seq, slot.spec.prompt)
    slot.fed = slot.keep


def prefill(backend: IBatchBackend, slot: Slot, sink: SlotSink | None) -> None:
    """Prefill the rest of the slot's prompt in a decode of its own, and draw its first token."""
    t0 = time.perf_counter()
    backend.prefill(slot.seq, slot.spec.prompt[slot.keep :], slot.keep)
    slot.fed = len(slot.spec.prompt)
    slot.prefill_s = time.perf_counter() - t0
    slot.started = time.perf_counter()
    if slot.spec.n_predict > 0:
        draw(backend, slot, -1, sink)


def draw(backend: IBatchBackend, slot: Slot, row: int, sink: SlotSink | None) -> None:
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


def finish(
    backend: IBatchBackend, slot: Slot, free: list[int], memory: SlotMemory, *, keep: bool
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
