"""``--route-trace`` and ``--io-trace`` (docs/telemetry.md): they observe only (the output is
bit-identical with them), the route trace replays through the domain's cache policy to the
streamer's own counters, and the I/O trace accounts for every byte the cache read."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import ExpertCachePolicy, StreamConfig, StreamCounters
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=16, n_ubatch=16, n_threads=2)
REQUESTS = [
    GenerateRequest("The quick brown fox jumps over the lazy dog, twice over.", n_predict=10),
    GenerateRequest("Hello", n_predict=8, sampling=SamplingParams(temp=1.0, seed=3)),
]


def run(
    path: Path, tmp: Path | None, **extra: object
) -> tuple[list[list[int]], np.ndarray, StreamCounters, dict]:
    traces = {} if tmp is None else {"route_trace": str(tmp / "route.csv"), "io_trace": str(tmp / "io.csv")}
    stream = StreamConfig(enabled=True, prefill_ahead=False, **traces, **extra)  # type: ignore[arg-type]
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        entry = s.streaming.info.entry_bytes
        s.streaming.set_budget(5 * entry)
        tokens = [list(s.generate(r).tokens) for r in REQUESTS]
        sizes = [s.streaming.streaming.streamer.entry_bytes(layer) for layer in range(s.model.n_layer)]
        info = {
            "budget": 5 * entry,
            "sizes": sizes,
            "k": s.model.n_expert_used,
            "eviction": s.streaming.streaming.streamer.eviction,
        }
        return tokens, s.last_logits(), s.streaming.counters(), info


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss", "qwen3moe-odd"])
def test_traces_observe_only_and_replay_to_the_same_counters(
    name: str, tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    path = tiny_model_path(name)
    plain = run(path, None)
    traced = run(path, tmp_path)
    assert traced[0] == plain[0] and np.array_equal(traced[1], plain[1])
    counters, info = traced[2], traced[3]

    with open(tmp_path / "route.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["turn"] for r in rows} == {"1", "2"}
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    policy = ExpertCachePolicy(
        info["budget"],
        info["sizes"],
        n_expert=max(int(r["expert"]) for r in rows) + 1,
        eviction=info["eviction"],
    )
    calls: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for r in rows:  # file order is execution order; a layer call is (turn, phase, step, layer)
        calls.setdefault((r["turn"], r["phase"], r["step"], r["layer"]), []).append(r)
    for (_, _, _, layer), call in calls.items():
        n_tokens = len({int(r["slot"]) // info["k"] for r in call})
        plan = policy.request(int(layer), [int(r["expert"]) for r in call if r["dropped"] == "0"], n_tokens)
        hits = {e for _, e in plan.hits}
        assert all((r["residency"] == "1") == (int(r["expert"]) in hits) for r in call)
        assert all(int(r["expert_bytes"]) == info["sizes"][int(layer)] for r in call)
    c = policy.counters
    assert (c.requests, c.hits, c.misses, c.evictions, c.bytes_read) == (
        counters.requests,
        counters.hits,
        counters.misses,
        counters.evictions,
        counters.bytes_read,
    )
    weights = [float(r["weight"]) for r in rows]
    assert all(0.0 <= w <= 1.0 for w in weights)

    with open(tmp_path / "io.csv", newline="") as f:
        reads = list(csv.DictReader(f))
    assert sum(int(r["req_bytes"]) for r in reads) == counters.bytes_read
    assert all(int(r["read_bytes"]) >= int(r["req_bytes"]) and int(r["latency_ns"]) > 0 for r in reads)
    assert {r["spec"] for r in reads} == {"0"}  # no read ahead in this run


def test_reads_ahead_are_tagged_in_the_io_trace(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    run(tiny_model_path("qwen3moe"), tmp_path, predict_prefetch=True)
    with open(tmp_path / "io.csv", newline="") as f:
        assert {r["spec"] for r in csv.DictReader(f)} == {"0", "1"}


def test_traces_need_streaming_and_the_fast_path() -> None:
    with pytest.raises(ConfigError, match="--route-trace need"):
        StreamConfig(route_trace="x.csv")
    with pytest.raises(ConfigError, match="--io-trace"):
        StreamConfig(enabled=True, io_trace="x.csv", policy="reference")
