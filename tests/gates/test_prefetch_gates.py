"""``--prefetch K`` is lossless and the C engine makes exactly the reference policy's
decisions: on every MoE fixture, with sampling (so the routing moves from token to token)
and caches smaller than one token's experts (so the previous token's experts are not
resident and reads ahead happen), tokens and logits equal the resident run bit for bit, and
the fast path's counters (prefetch ones included) and LRU order equal the reference's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig, StreamCounters
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
REQUEST = GenerateRequest("Hello, world", n_predict=24, sampling=SamplingParams(temp=1.0, seed=5))
FIXTURES = ["qwen3moe", "qwen35moe", "gpt-oss", "qwen3moe-odd", "qwen3moe-split", "mixtral", "deepseek2"]


def run(path: Path, *, prefetch: int = 0, policy: str = "fast", budget_entries: int | None = None) -> tuple:
    stream = StreamConfig(enabled=budget_entries is not None, cache_mb=None, prefetch=prefetch, policy=policy)
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        if s.streaming is not None and budget_entries is not None:
            s.streaming.set_budget(budget_entries * s.streaming.info.entry_bytes)
        result = s.generate(REQUEST)
        counters = s.streaming.counters() if s.streaming is not None else None
        resident = s.streaming.resident_entries() if s.streaming is not None else None
        return result.tokens, s.last_logits(), counters, resident


def no_timers(c: StreamCounters) -> StreamCounters:
    return c.decisions()


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize(("prefetch", "budget_entries"), [(1, 3), (2, 4)])
def test_prefetch_is_lossless_and_the_fast_path_decides_as_the_reference(
    name: str, prefetch: int, budget_entries: int, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    tokens, logits, _, _ = run(path)
    fast = run(path, prefetch=prefetch, budget_entries=budget_entries)
    ref = run(path, prefetch=prefetch, budget_entries=budget_entries, policy="reference")
    for got in (fast, ref):
        assert got[0] == tokens
        assert np.array_equal(got[1], logits)
    assert no_timers(fast[2]) == no_timers(ref[2])
    assert fast[3] == ref[3]
    assert fast[2].prefetch_issued > 0  # reads ahead did happen
    assert 0 < fast[2].bytes_landed <= fast[2].bytes_read  # a read is counted when planned
    assert fast[2].prefetch_hits + fast[2].prefetch_wasted <= fast[2].prefetch_issued


def test_prefetch_changes_what_is_read_not_what_is_computed(tiny_model_path: TinyModel) -> None:
    """The negative side: with prefetch the cache's history differs (so the gate above
    compares something), while the output does not."""
    path = tiny_model_path("qwen3moe")
    base = run(path, budget_entries=6)
    ahead = run(path, prefetch=1, budget_entries=6)
    assert base[0] == ahead[0]
    assert (base[2].hits, base[2].evictions) != (ahead[2].hits, ahead[2].evictions)
    assert ahead[2].prefetch_hits > 0


def test_prefetch_needs_the_cache() -> None:
    with pytest.raises(ConfigError, match="--prefetch needs the cache"):
        StreamConfig(enabled=True, cache_mb=0, prefetch=1)


LONG = GenerateRequest(" ".join(["the quick brown fox jumps over a lazy dog"] * 14), n_predict=6)
LONG_PARAMS = ContextParams(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=2)


def run_long(path: Path, *, ahead: bool, policy: str = "fast") -> tuple:
    stream = StreamConfig(enabled=True, cache_mb=None, prefill_ahead=ahead, policy=policy)
    with Session.open(SessionConfig(model_path=path, context=LONG_PARAMS, stream=stream)) as s:
        s.streaming.set_budget(40 * s.streaming.info.entry_bytes)  # type: ignore[union-attr]
        result = s.generate(LONG)
        return result.tokens, s.last_logits(), s.streaming.counters(), s.streaming.resident_entries()  # type: ignore[union-attr]


@pytest.mark.parametrize("name", FIXTURES)
def test_reading_the_next_layer_ahead_in_prefill_is_lossless_and_decided_alike(
    name: str, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    without = run_long(path, ahead=False)
    fast = run_long(path, ahead=True)
    ref = run_long(path, ahead=True, policy="reference")
    for got in (fast, ref):
        assert got[0] == without[0]
        assert np.array_equal(got[1], without[1])
    assert no_timers(fast[2]) == no_timers(ref[2]) and fast[3] == ref[3]
    assert fast[2].prefetch_issued > 0 and fast[2].prefetch_hits > 0  # the prefill read ahead
    assert without[2].prefetch_issued == 0
