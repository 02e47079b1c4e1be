"""Expert streaming gates: streamed output equals resident output bit for bit (G1-G3, S2,
S3, the stock oracle), the C cache follows the Python policy exactly, and faults are fatal
and named. Every MoE fixture, the split one included."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.cext import expert_stream
from bmoe.cext.route_recorder import RouteRecorder
from bmoe.domain.expert_lru import ExpertLru
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import DecodeAbortedError, ExpertReadError, SessionFailedError
from bmoe.runtime import Session, SessionConfig, run
from bmoe.testing.oracle import stock_greedy

FIXTURES = ["qwen3moe", "qwen35moe", "gpt-oss", "qwen3moe-odd", "qwen3moe-split"]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"
REQUEST = GenerateRequest(PROMPT, n_predict=16)

TinyModel = Callable[[str], Path]


def resident(path: Path) -> tuple[tuple[int, ...], np.ndarray]:
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as s:
        result = s.generate(REQUEST)
        return result.tokens, s.last_logits()


def streamed(path: Path, *, cache_mb: int | None, budget_entries: int | None = None) -> Session:
    cfg = SessionConfig(model_path=path, context=PARAMS, stream=StreamConfig(enabled=True, cache_mb=cache_mb))
    session = Session.open(cfg)
    assert session.streaming is not None, session.notes
    if budget_entries is not None:
        session.streaming.set_budget(budget_entries * session.streaming.info.entry_bytes)
    return session


@pytest.fixture(params=FIXTURES)
def model_path(request: pytest.FixtureRequest, tiny_model_path: TinyModel) -> Path:
    return tiny_model_path(request.param)


@pytest.mark.parametrize(
    ("gate", "cache_mb", "budget_entries"),
    [("G1 cache off", 0, None), ("G2 evicting cache", None, 1), ("G3 cache holds all", 1024, None)],
)
def test_streamed_equals_resident(
    model_path: Path, gate: str, cache_mb: int | None, budget_entries: int | None
) -> None:
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=cache_mb, budget_entries=budget_entries) as s:
        result = s.generate(REQUEST)
        assert result.tokens == tokens, gate
        assert np.array_equal(s.last_logits(), logits), gate
        stats = s.streaming.streamer.stats()
        report = result.stream
    assert report is not None and stats["misses"] > 0
    if gate.startswith("G3"):
        assert stats["evictions"] == 0
    else:
        assert stats["evictions"] > 0 and report.decode.evictions > 0  # evicts while decoding


def test_negative_control_without_reads_the_output_changes(model_path: Path) -> None:
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=0) as s:
        s.streaming.streamer.mode = expert_stream.MODE_OFF  # experts never read: zeros
        result = s.generate(REQUEST)
        assert not np.array_equal(s.last_logits(), logits)
    assert result.tokens != tokens


def test_s2_warm_second_generate_with_an_evicting_cache_equals_the_cold_run(model_path: Path) -> None:
    cold = run(SessionConfig(model_path=model_path, context=PARAMS), REQUEST)
    with streamed(model_path, cache_mb=None, budget_entries=3) as s:
        s.generate(GenerateRequest("Warm the cache up with something else", n_predict=8))
        warm = s.generate(REQUEST)
        assert s.streaming.streamer.stats()["rereads"] > 0
    assert warm.tokens == cold.tokens


def test_s3_the_budget_shrinks_between_requests_and_output_stays_exact(model_path: Path) -> None:
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=1024) as s:
        s.generate(REQUEST)
        before = s.streaming.streamer.stats()["resident_bytes"]
        s.set_cache_budget(0)
        assert s.streaming.streamer.stats()["resident_bytes"] < before
        again = s.generate(REQUEST)
        assert again.tokens == tokens
        assert np.array_equal(s.last_logits(), logits)


@pytest.mark.parametrize("name", ["qwen3moe", "qwen3moe-split"])
def test_oracle_stock_llama_cpp_equals_the_streamed_run(name: str, tiny_model_path: TinyModel) -> None:
    path = tiny_model_path(name)
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
    cfg = SessionConfig(
        model_path=path, context=params, stream=StreamConfig(enabled=True, cache_mb=0), n_predict=10
    )
    with Session.open(cfg) as s:
        ours = s.generate(GenerateRequest(PROMPT))
        our_logits = s.last_logits()
    theirs, their_logits = stock_greedy(path, PROMPT, 10)
    assert list(ours.tokens) == theirs
    assert np.array_equal(our_logits, their_logits)


def routing_trace(path: Path) -> list[tuple[int, np.ndarray]]:
    """Per MoE layer call, the selected ids of a resident run of REQUEST (same graph)."""
    recorder = RouteRecorder()
    with LlamaModel(path) as model, LlamaContext(model, PARAMS, eval_callback=recorder) as ctx:
        prompt = model.tokenize(PROMPT)
        ctx.decode(prompt, 0)
        pos = len(prompt)
        tokens = []
        for _ in range(REQUEST.n_predict or 0):
            token = int(np.argmax(ctx.logits()))
            tokens.append(token)
            if len(tokens) == REQUEST.n_predict:
                break
            ctx.decode([token], pos)
            pos += 1
    return [(layer, ids) for layer, ids, _ in recorder.records()]


@pytest.mark.parametrize("budget_entries", [0, 1, 5, 1000])
def test_the_c_cache_follows_the_python_policy_step_for_step(
    tiny_model_path: TinyModel, budget_entries: int
) -> None:
    path = tiny_model_path("qwen3moe")
    trace = routing_trace(path)
    with streamed(path, cache_mb=None, budget_entries=budget_entries) as s:
        s.generate(REQUEST)
        c_stats = s.streaming.streamer.stats()
        c_resident = s.streaming.streamer.resident_entries()
        entry = s.streaming.info.entry_bytes
    lru = ExpertLru(budget_bytes=budget_entries * entry, entry_bytes=entry)
    for layer, ids in trace:
        lru.request(layer, ids.reshape(-1).tolist())
        lru.check_valid()
    c = lru.counters
    assert (
        c_stats["hits"],
        c_stats["misses"],
        c_stats["evictions"],
        c_stats["rereads"],
        c_stats["bytes_read"],
    ) == (c.hits, c.misses, c.evictions, c.rereads, c.bytes_read)
    assert c_resident == lru.resident()


def test_a_truncated_model_file_is_one_fatal_error_naming_it(
    tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model_path("qwen3moe"), path)
    with streamed(path, cache_mb=0) as s:
        s.generate(GenerateRequest(PROMPT, n_predict=2))
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        # the C read path: a short read aborts the decode instead of computing with zeros
        s.ctx.clear()
        with pytest.raises(DecodeAbortedError):
            s.ctx.decode(s.model.tokenize(PROMPT), 0)
        file_index, offset, _ = s.streaming.streamer.fault()
        assert file_index == 0 and offset >= size // 2 - 4096
        with pytest.raises(ExpertReadError, match=rf"expert read failed: {path} at offset {offset}"):
            s.generate(GenerateRequest(PROMPT, n_predict=2))
        with pytest.raises(SessionFailedError):
            s.generate(GenerateRequest(PROMPT, n_predict=2))


def test_a_replaced_model_file_ends_the_session(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model_path("qwen3moe"), path)
    with streamed(path, cache_mb=0) as s:
        s.generate(GenerateRequest(PROMPT, n_predict=2))
        path.unlink()
        shutil.copy(tiny_model_path("qwen3moe"), path)
        with pytest.raises(ExpertReadError, match="model file replaced or truncated under the session"):
            s.generate(GenerateRequest(PROMPT, n_predict=2))
