"""Slots that keep their KV (``-np N``): the slot choice (``SlotMemory.pick``, llama.cpp's
similarity rule) and ``BatchRun(keep_slots=True)`` over a backend that models each
sequence's memory as its tokens: a conversation that comes back to its slot prefills only
what it added, and replies exactly as a fresh run; idle slots give their cells back, least
recently used first, when a request needs room."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.prompt_cache import PromptCache
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.slots import SlotChoice, SlotMemory
from bmoe.service.batch_generation import BatchJob, BatchOutput, BatchRun

EOG = 0


def test_the_slot_sharing_the_longest_prefix_else_an_empty_one_else_the_least_recently_used() -> None:
    memory = SlotMemory(3)
    memory.hold(0, (1, 2, 3, 4))
    memory.hold(1, (1, 2, 9))
    assert memory.pick((1, 2, 3, 4, 5), [0, 1, 2]) == SlotChoice(0, 4)
    assert memory.pick((1, 2, 3, 4), [0, 1, 2]) == SlotChoice(0, 3)  # its last token is prefilled
    assert memory.pick((1, 2, 9, 9), [1, 2]) == SlotChoice(1, 3)
    assert memory.pick((7, 7), [0, 1, 2]) == SlotChoice(2, 0)  # nothing shared: the empty one
    assert memory.pick((7, 7), [0, 1]) == SlotChoice(0, 0)  # ... else the least recently used
    long = (1, *range(100, 140))
    assert memory.pick(long, [0, 1]).keep == 0  # 1 of 41 tokens shared: under the similarity
    assert memory.to_drop([0, 1, 2]) == [0, 1]


class TokenMemory:
    """Each sequence's memory is its tokens; the next token is a pure function of them."""

    def __init__(self, n_seq: int, n_ctx: int = 200) -> None:
        self.n_seq, self.n_ctx = n_seq, n_ctx
        self.n_batch = 16
        self.steps: list[tuple[int, int | None]] = []  # (tokens, decode tokens) of each step
        self.outputs: list[bool] = []
        self.loaded: list[int] = []  # the sequences a kept state was put into
        self.seqs: dict[int, list[int]] = {}
        self.prefilled: list[tuple[int, int, int]] = []  # (seq, start, n tokens)
        self.rows: list[int] = []

    def clear(self) -> None:
        self.seqs.clear()

    def drop(self, seq: int) -> None:
        self.seqs.pop(seq, None)

    def save_state(self, seq: int) -> np.ndarray | None:
        held = self.seqs.get(seq, [])
        return np.array(held, dtype=np.int64).view(np.uint8) if held else None

    def load_state(self, seq: int, blob: np.ndarray) -> bool:
        self.seqs[seq] = [int(t) for t in blob.view(np.int64)]
        self.loaded.append(seq)
        return True

    def keep(self, seq: int, n_keep: int) -> bool | None:
        del self.seqs.setdefault(seq, [])[n_keep:]
        return True

    def prefill(self, seq: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        held = self.seqs.setdefault(seq, [])
        assert start_pos == len(held), (seq, start_pos, held)
        held.extend(tokens)
        assert sum(len(t) for t in self.seqs.values()) <= self.n_ctx, "out of cells"
        self.prefilled.append((seq, start_pos, len(tokens)))
        self.rows = [seq]

    def step(
        self,
        entries: Sequence[tuple[int, int, int]],
        outputs: Sequence[bool] | None = None,
        *,
        n_decode: int | None = None,
    ) -> None:
        assert len(entries) <= self.n_batch
        self.steps.append((len(entries), n_decode))
        self.outputs = list(outputs) if outputs is not None else [True] * len(entries)
        for token, pos, seq in entries:
            held = self.seqs.setdefault(seq, [])
            assert pos == len(held), (seq, pos, len(held))
            held.append(token)
        assert sum(len(t) for t in self.seqs.values()) <= self.n_ctx, "out of cells"
        self.rows = [seq for _, _, seq in entries]

    def start_sampling(self, seq: int, params: SamplingParams, constraint: OutputConstraint | None) -> None:
        pass

    def sample(self, seq: int, row: int) -> int:
        assert self.rows[row] == seq and (row == -1 or self.outputs[row]), "no logits there"
        context = self.seqs[seq]
        return (sum(context) * 7 + len(context)) % 50 + 1

    def token_logprob(self, row: int, token: int, top: int) -> TokenLogprob:
        return TokenLogprob(TokenChoice(token, b"", 0.0))

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return b"x"

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def close_samplers(self) -> None:
        pass


def serve(run: BatchRun, jobs: list[BatchJob]) -> list[BatchOutput]:
    tickets = [run.add(job) for job in jobs]
    out: dict[int, BatchOutput] = {}
    while not run.idle:
        out.update(run.step())
    return [out[t] for t in tickets]


SYSTEM = tuple(range(60, 90))


def test_a_conversation_coming_back_to_its_slot_prefills_only_what_it_added() -> None:
    backend = TokenMemory(2)
    run = BatchRun(backend, keep_slots=True)
    a1 = BatchJob((*SYSTEM, 1, 2, 3), 5)
    b1 = BatchJob((*SYSTEM, 4, 5), 5)
    first = serve(run, [a1, b1])
    a2 = BatchJob((*a1.prompt, *first[0].tokens, 6, 7), 5)  # the history, the reply, a new message
    b2 = BatchJob((*b1.prompt, *first[1].tokens, 8), 5)
    second = serve(run, [b2, a2])  # in the other order: each finds its own slot
    # each kept its prompt; its reply's cells were cut (computed one per step, they are
    # computed again with the new message, in a batch, as a fresh server computes them)
    assert [o.reused for o in second] == [len(b1.prompt), len(a1.prompt)]
    fresh = serve(BatchRun(TokenMemory(2)), [b2, a2])
    assert [o.tokens for o in second] == [o.tokens for o in fresh]
    assert backend.prefilled[-2:] == [(1, len(b1.prompt), 5 + 1), (0, len(a1.prompt), 5 + 2)]


class RecurrentMemory(TokenMemory):
    """A memory that cannot remove a part of a sequence (a recurrent state)."""

    def keep(self, seq: int, n_keep: int) -> bool | None:
        return n_keep >= len(self.seqs.get(seq, [])) and super().keep(seq, n_keep)


def test_a_memory_that_cannot_cut_the_reply_keeps_it_and_a_turn_extending_it_reuses_it() -> None:
    backend = RecurrentMemory(2)
    run = BatchRun(backend, keep_slots=True)
    a1 = BatchJob((*SYSTEM, 1, 2, 3), 5)
    [out] = serve(run, [a1])
    assert run.memory.held[0] == (*a1.prompt, *out.tokens[:4])  # the reply but its last token
    a2 = BatchJob((*a1.prompt, *out.tokens, 6, 7), 5)
    [again] = serve(run, [a2])
    assert again.reused == len(a1.prompt) + 4
    assert again.tokens == serve(BatchRun(TokenMemory(2)), [a2])[0].tokens


def test_without_keep_slots_every_request_starts_empty() -> None:
    backend = TokenMemory(2)
    run = BatchRun(backend)
    serve(run, [BatchJob((*SYSTEM, 1), 3)])
    assert serve(run, [BatchJob((*SYSTEM, 1, 5), 3)])[0].reused == 0
    assert backend.seqs == {}


def test_the_memory_outlives_the_run_when_handed_to_the_next() -> None:
    backend = TokenMemory(2)
    first = BatchRun(backend, keep_slots=True)
    out = serve(first, [BatchJob((*SYSTEM, 1), 3)])
    again = BatchRun(backend, first.memory, keep_slots=True)
    assert serve(again, [BatchJob((*SYSTEM, 1, *out[0].tokens, 9), 3)])[0].reused == len(SYSTEM) + 1


@pytest.mark.parametrize("n_ctx", [80, 120])
def test_idle_slots_give_their_cells_back_least_recently_used_first(n_ctx: int) -> None:
    backend = TokenMemory(3, n_ctx)
    run = BatchRun(backend, keep_slots=True)
    serve(run, [BatchJob((*SYSTEM, 1), 5), BatchJob((*SYSTEM[:5], 2), 5)])  # 31 + 6 cells kept
    other = BatchJob(tuple(range(1, 40)), 5)  # shares nothing: 44 cells while it runs
    serve(run, [other])
    held = [len(t) for t in run.memory.held]
    assert sum(held) <= n_ctx and held[2] == 39  # its prompt (its reply's cells cut)
    assert (held[0] == 0) == (n_ctx < 31 + 6 + 44)  # the least recently used gave its cells


class Counting:
    """A sink that counts the steps between its tokens."""

    def __init__(self, run: BatchRun) -> None:
        self.run = run
        self.at: list[int] = []

    def token(self, token: int, text: str, reasoning: str, logprob: TokenLogprob | None) -> None:
        self.at.append(len(self.backend_steps()))

    def backend_steps(self) -> list[tuple[int, int | None]]:
        backend = self.run.backend
        assert isinstance(backend, TokenMemory)
        return backend.steps

    def wants_stop(self) -> bool:
        return False


@pytest.mark.parametrize("chunked", [True, False])
def test_a_long_prompt_joins_in_chunks_while_the_running_stream_keeps_its_pace(chunked: bool) -> None:
    backend = TokenMemory(2, n_ctx=400)
    run = BatchRun(backend, keep_slots=True, chunked=chunked)
    streaming, joining = Counting(run), Counting(run)
    long = BatchJob(tuple(range(1, 51)), 4)
    run.add(BatchJob((*SYSTEM, 1), 12), streaming)
    out: dict[int, BatchOutput] = {}
    for _ in range(3):
        out.update(run.step())
    ticket = run.add(long, joining)
    while not run.idle:
        out.update(run.step())
    gaps = [b - a for a, b in zip(streaming.at, streaming.at[1:], strict=False)]
    if chunked:  # never left out: a token every step; the prompt in ceil(50 / 15) steps
        assert max(gaps) == 1
        assert joining.at[0] == 3 + 4  # added after step 3: 15 + 15 + 15 + 5 tokens
        assert [n for n, d in backend.steps[3:7]] == [16, 16, 16, 6] and backend.steps[3][1] == 1
    else:  # the prompt's own decode: the stream waits for it (a prefill is not a step here)
        assert max(gaps) == 1 and len(backend.prefilled) == 2
    fresh = serve(BatchRun(TokenMemory(1, n_ctx=400)), [long])
    assert out[ticket].tokens == fresh[0].tokens  # the same reply, chunked or not


@pytest.mark.parametrize("n_seq", [1, 2])
def test_more_conversations_than_slots_come_back_through_the_prompt_cache(n_seq: int) -> None:
    backend = TokenMemory(n_seq, n_ctx=400)
    cache = PromptCache(None)
    run = BatchRun(backend, keep_slots=True, prompt_cache=cache)
    firsts = [BatchJob((*SYSTEM, 10 + c, 20 + c), 4) for c in range(3)]  # three conversations
    out = serve(run, firsts)
    seconds = [
        BatchJob((*j.prompt, *o.tokens, 30 + c), 4) for c, (j, o) in enumerate(zip(firsts, out, strict=True))
    ]
    again = serve(run, seconds)
    fresh = serve(BatchRun(TokenMemory(1, n_ctx=400)), seconds)
    assert [o.tokens for o in again] == [o.tokens for o in fresh]
    assert all(o.reused == len(j.prompt) for o, j in zip(again, firsts, strict=True))  # each its own
    assert sum(o.restored > 0 for o in again) >= 3 - (n_seq - 1)  # its slot still held it, or the cache did
    assert len(backend.loaded) == cache.counters.restored


def test_an_idle_slot_keeps_its_cells_while_the_running_ones_leave_too_little_anyway() -> None:
    backend = TokenMemory(3, n_ctx=80)
    run = BatchRun(backend, keep_slots=True)
    serve(run, [BatchJob((5, 6, 7), 4)])  # slot 0 keeps 3 cells (its prompt)
    run.add(BatchJob(tuple(range(100, 150)), 10))  # runs: 60 cells
    run.step()
    run.add(BatchJob(tuple(range(200, 245)), 5))  # needs 50: cannot fit beside it at all
    run.step()
    assert len(run.memory.held[0]) == 3  # nothing given back for nothing


def test_prompts_that_arrive_together_share_their_steps() -> None:
    """Chunked: requests let in at one step are prefilled in the same steps (streamed, one
    pass over the experts for all of them where they fit a batch), none in a decode of its
    own; each replies as it would alone."""
    backend = TokenMemory(2, n_ctx=400)
    run = BatchRun(backend, keep_slots=True, chunked=True)
    jobs = [BatchJob((*SYSTEM[:5], 1), 3), BatchJob((*SYSTEM[:8], 2), 3)]
    out = serve(run, jobs)
    assert backend.prefilled == []  # no prompt had a decode of its own
    assert backend.steps[0] == (15, 0)  # both prompts, 6 + 9 tokens, in the first step
    alone = [serve(BatchRun(TokenMemory(1, n_ctx=400)), [job])[0] for job in jobs]
    assert [o.tokens for o in out] == [a.tokens for a in alone]
