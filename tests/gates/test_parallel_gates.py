"""Parallel sequences (``Session.generate_batch``, ``ContextParams.n_seq_max``): several
requests in one context, one ``llama_decode`` per step holding a token of each.

- Streamed equals resident under the same batching, bit for bit (tokens and every logprob),
  and the fast path decides as the reference policy (the same counters).
- A step reads each expert once for all its sequences: the batch makes one cache request
  per MoE layer per step, fewer than the requests alone, and reads less.
- Batched against alone: the tokens are the same here, the log-probabilities are not bit
  for bit (llama.cpp's kernels for a batch of several rows round differently); that is
  measured and said, not gated as equal.
- Continuous batching: more requests than sequences all come back, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig, StreamCounters
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig

TinyModelPath = Callable[..., Path]
PROMPTS = ["Hello there", "The weather today is", "Once upon a time", "A B C", "Numbers: 1 2 3"]


def _requests(n_predict: int = 10) -> list[GenerateRequest]:
    return [
        GenerateRequest(p, n_predict=n_predict + i, logprobs=3, sampling=SamplingParams(temp=0.8, seed=i))
        for i, p in enumerate(PROMPTS)
    ]


def _run(
    path: Path, stream: StreamConfig, n_seq: int, requests: list[GenerateRequest]
) -> tuple[list[RunResult], StreamCounters | None]:
    config = SessionConfig(model_path=path, context=ContextParams(n_ctx=512, n_seq_max=n_seq), stream=stream)
    with Session.open(config) as session:
        before = session.streaming.counters() if session.streaming is not None else None
        results = session.generate_batch(requests)
        after = session.streaming.counters() if session.streaming is not None else None
    return results, (after - before) if after is not None and before is not None else None


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_streamed_equals_resident_under_the_same_batching(
    tiny_model_path: TinyModelPath, name: str, policy: str
) -> None:
    path = tiny_model_path(name)
    resident, _ = _run(path, StreamConfig(), 3, _requests())
    streamed, counters = _run(path, StreamConfig(enabled=True, cache_mb=1, policy=policy), 3, _requests())
    assert counters is not None and counters.misses > 0  # it did stream
    for a, b in zip(resident, streamed, strict=True):
        assert a.tokens == b.tokens
        assert a.logprobs == b.logprobs  # every chosen and top-3 log-probability, bit for bit
        assert a.text == b.text


def test_the_fast_path_decides_batched_steps_as_the_reference(tiny_model_path: TinyModelPath) -> None:
    path = tiny_model_path("qwen3moe")
    _, fast = _run(path, StreamConfig(enabled=True, cache_mb=1), 3, _requests())
    _, reference = _run(path, StreamConfig(enabled=True, cache_mb=1, policy="reference"), 3, _requests())
    assert fast is not None and reference is not None
    assert fast.decisions() == reference.decisions()


def test_a_step_reads_each_expert_once_for_all_its_sequences(tiny_model_path: TinyModelPath) -> None:
    """With the cache off, every call reads what it routes: the batch reads each step's
    union of experts once (fewer bytes than the sequences alone), in one request a layer."""
    path = tiny_model_path("qwen3moe")
    requests = [GenerateRequest(p, n_predict=12) for p in PROMPTS[:3]]
    stream = StreamConfig(enabled=True, cache_mb=0)
    _, batched = _run(path, stream, 3, requests)
    alone = [_run(path, stream, 1, [r])[1] for r in requests]
    assert batched is not None and all(c is not None for c in alone)
    alone_requests = sum(c.requests for c in alone if c is not None)
    alone_bytes = sum(c.bytes_read for c in alone if c is not None)
    assert batched.requests < alone_requests * 0.6  # one request per layer per step, not per sequence
    assert batched.bytes_read < alone_bytes


def test_batched_tokens_equal_alone_here_and_the_logprobs_are_measured_not_assumed(
    tiny_model_path: TinyModelPath,
) -> None:
    path = tiny_model_path("qwen3moe")
    greedy = [GenerateRequest(p, n_predict=10, logprobs=3) for p in PROMPTS[:3]]
    batched, _ = _run(path, StreamConfig(), 3, greedy)
    alone = [_run(path, StreamConfig(), 1, [r])[0][0] for r in greedy]
    assert [b.tokens for b in batched] == [a.tokens for a in alone]
    worst = max(
        abs(x.chosen.logprob - y.chosen.logprob)
        for b, a in zip(batched, alone, strict=True)
        for x, y in zip(b.logprobs, a.logprobs, strict=True)
    )
    assert worst < 1e-3  # rounding of a batched kernel, not another computation


def test_more_requests_than_sequences_all_come_back_in_order(tiny_model_path: TinyModelPath) -> None:
    path = tiny_model_path("qwen3moe")
    requests = _requests(6)
    two, _ = _run(path, StreamConfig(), 2, requests)
    five, _ = _run(path, StreamConfig(), 5, requests)
    assert [len(r.tokens) for r in two] == [len(r.tokens) for r in five]
    assert all(r.n_prompt > 0 and len(r.tokens) <= 6 + i for i, r in enumerate(two))


def test_routing_policies_are_refused_with_parallel_sequences(tiny_model_path: TinyModelPath) -> None:
    config = SessionConfig(
        model_path=tiny_model_path("qwen3moe"),
        context=ContextParams(n_ctx=256, n_seq_max=2),
        stream=StreamConfig(enabled=True, cache_mb=1, route_ahead=2),
    )
    with Session.open(config) as session, pytest.raises(ConfigError, match="routing policies"):
        session.generate_batch([GenerateRequest("Hi", n_predict=2)])
