"""``run_batch``'s scheduling against a scripted backend: at most ``n_seq`` sequences at a
time, a finished one's slot taken by the next request at once, no more admitted than the
shared KV cache holds, one step per round holding a token of every running sequence, the
outputs in the requests' order."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import ContextOverflowError
from bmoe.service.batch_generation import BatchJob, run_batch

EOG = 0


class ScriptedBatch:
    """Each sequence writes its prompt's first token + 1, + 2, ... (token ``EOG`` ends it)."""

    def __init__(self, n_seq: int, n_ctx: int = 100) -> None:
        self.n_seq, self.n_ctx = n_seq, n_ctx
        self.steps: list[list[tuple[int, int, int]]] = []
        self.prefills: list[int] = []
        self.next: dict[int, int] = {}
        self.rows: list[int] = []
        self.dropped: list[int] = []

    def clear(self) -> None:
        self.next.clear()

    def drop(self, seq: int) -> None:
        self.dropped.append(seq)
        del self.next[seq]

    def keep(self, seq: int, n_keep: int) -> bool | None:
        raise AssertionError("run_batch starts every request empty and keeps no slot")

    def prefill(self, seq: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        assert start_pos == 0
        assert seq not in self.next and len(self.next) < self.n_seq
        self.prefills.append(seq)
        self.next[seq] = tokens[0] + 1
        self.rows = [seq]

    def step(
        self,
        entries: Sequence[tuple[int, int, int]],
        outputs: Sequence[bool] | None = None,
        *,
        n_decode: int | None = None,
    ) -> None:
        assert outputs is None or all(outputs)
        self.steps.append(list(entries))
        self.rows = [seq for _, _, seq in entries]

    def start_sampling(self, seq: int, params: SamplingParams, constraint: OutputConstraint | None) -> None:
        pass

    def sample(self, seq: int, row: int) -> int:
        assert self.rows[row] == seq
        token = self.next[seq]
        self.next[seq] = token + 1 if token != 99 else EOG
        return token

    def token_logprob(self, row: int, token: int, top: int) -> TokenLogprob:
        return TokenLogprob(TokenChoice(token, b"", 0.0))

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return bytes([97 + token % 26])

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def close_samplers(self) -> None:
        pass


def test_sequences_run_together_and_a_freed_slot_takes_the_next_request() -> None:
    backend = ScriptedBatch(n_seq=2)
    jobs = [BatchJob((10,), 3), BatchJob((20,), 1), BatchJob((30,), 2)]
    out = run_batch(backend, jobs)
    assert [o.tokens for o in out] == [(11, 12, 13), (21,), (31, 32)]
    assert backend.prefills == [0, 1, 1]  # job 1 ends at its first token: job 2 takes its slot
    assert [sorted(seq for *_, seq in step) for step in backend.steps] == [[0, 1], [0]]
    assert backend.steps[0] == [(11, 1, 0), (31, 1, 1)]  # (token, position, sequence)


def test_no_more_are_admitted_than_the_shared_cache_holds() -> None:
    backend = ScriptedBatch(n_seq=4, n_ctx=10)
    jobs = [BatchJob((10, 10), 3)] * 3  # 5 cells each: two fit at once
    run_batch(backend, jobs)
    assert max(len(step) for step in backend.steps) == 2


def test_an_end_of_generation_token_ends_a_sequence_early_and_is_not_kept() -> None:
    backend = ScriptedBatch(n_seq=1)
    (out,) = run_batch(backend, [BatchJob((97,), 10)])
    assert out.tokens == (98, 99) and out.stopped_at_eog


def test_a_request_that_cannot_fit_alone_is_refused_before_anything_runs() -> None:
    backend = ScriptedBatch(n_seq=2, n_ctx=8)
    with pytest.raises(ContextOverflowError, match="request 1"):
        run_batch(backend, [BatchJob((1,), 2), BatchJob((1,) * 5, 5)])
    assert backend.prefills == []
