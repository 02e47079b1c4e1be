"""Microbenchmarks of the streaming decisions (pytest-benchmark; the normal test run only
checks they run). Measure with::

    pytest tests/benchmarks --benchmark-enable --benchmark-only

- the domain policy's cost per token on a Qwen3-30B-shaped routing trace (48 MoE layers,
  128 experts, top-8, routing that varies per token, a cache of a quarter of the experts);
- the C cache core's cost per token on the same trace (what the fast path pays per token
  for LRU bookkeeping, the kernel's page release excluded);
- the page release it leaves to the kernel: ``madvise(MADV_DONTNEED)`` of an evicted entry
  plus the page faults of refilling it, against refilling pages that stayed resident.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import numpy as np
import pytest

from bmoe.cext.cache_core import ExpertCacheCore
from bmoe.cext.expert_stream import ExpertStreamer, advise_hugepages
from bmoe.domain.streaming import ExpertCachePolicy
from bmoe.domain.streaming.cache_policy import Eviction

N_LAYER, N_EXPERT, TOP_K, N_TOKENS = 48, 128, 8, 64
# Q4_K_M-like: most layers' expert entries one size, every fourth layer stored at a higher precision
ENTRY_BYTES = [1_769_472 if layer % 4 else 2_359_296 for layer in range(N_LAYER)]
BUDGET = sum(ENTRY_BYTES) * N_EXPERT // 4  # a quarter of all experts


def routing_trace(seed: int = 0) -> np.ndarray:
    """Rows ``[layer, id0..id7]`` for N_TOKENS decode tokens: each layer has its own skewed
    expert popularity (a Dirichlet draw), each token samples 8 distinct experts from it."""
    rng = np.random.default_rng(seed)
    popularity = rng.dirichlet(np.full(N_EXPERT, 0.3), size=N_LAYER)
    rows = []
    for _ in range(N_TOKENS):
        for layer in range(N_LAYER):
            ids = rng.choice(N_EXPERT, size=TOP_K, replace=False, p=popularity[layer])
            rows.append([layer, *ids])
    return np.ascontiguousarray(np.array(rows, dtype=np.int32))


TRACE = routing_trace()


def hit_rate(policy: ExpertCachePolicy) -> float:
    c = policy.counters
    return c.hits / (c.hits + c.misses)


def test_the_trace_is_a_fair_cache_workload() -> None:
    """Routing moves: at a quarter of the experts an LRU hits well under 90%."""
    policy = ExpertCachePolicy(BUDGET, ENTRY_BYTES, N_EXPERT)
    for row in TRACE:
        policy.request(int(row[0]), row[1:].tolist())
    assert 0.2 < hit_rate(policy) < 0.9


def test_domain_policy_per_token(benchmark: Any) -> None:
    rows = [(int(r[0]), r[1:].tolist()) for r in TRACE]

    def run() -> ExpertCachePolicy:
        policy = ExpertCachePolicy(BUDGET, ENTRY_BYTES, N_EXPERT)
        for layer, ids in rows:
            policy.request(layer, ids)
        return policy

    policy = benchmark(run)
    benchmark.extra_info["tokens"] = N_TOKENS
    benchmark.extra_info["hit_rate"] = hit_rate(policy)


@pytest.mark.parametrize("eviction", ["slru", "lfu", "lru", "adaptive"])
def test_c_core_per_token(benchmark: Any, eviction: Eviction) -> None:
    """The C core's decisions per token under each rule (adaptive: with its three ghosts)."""

    def run() -> int:
        core = ExpertCacheCore(BUDGET, ENTRY_BYTES, N_EXPERT, eviction=eviction)
        return core.request_many(TRACE)

    loads = benchmark(run)
    policy = ExpertCachePolicy(BUDGET, ENTRY_BYTES, N_EXPERT, eviction=eviction)
    for row in TRACE:
        policy.request(int(row[0]), row[1:].tolist())
    assert loads == policy.counters.misses  # the same decisions as the reference
    benchmark.extra_info["tokens"] = N_TOKENS


ENTRY = ENTRY_BYTES[1]
N_SLOTS = 16


@pytest.fixture(scope="module")
def expert_memory() -> Any:
    """An anonymous region of N_SLOTS entries (one projection each), declared to a streamer."""
    region = mmap.mmap(-1, ENTRY * N_SLOTS, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    advise_hugepages(base, ENTRY * N_SLOTS, False)  # as the engine does for expert memory
    streamer = ExpertStreamer(n_layer=1, n_expert=N_SLOTS, n_proj=1)
    streamer.set_projection(0, 0, base, ENTRY, 0, 0)
    view = np.frombuffer(region, dtype=np.uint8)
    source = np.random.default_rng(1).integers(0, 255, ENTRY, dtype=np.uint8)
    yield streamer, view, source
    del view
    streamer.close()


@pytest.mark.parametrize("release", [False, True], ids=["pages-kept", "pages-released"])
def test_refill_an_entry(benchmark: Any, expert_memory: Any, release: bool) -> None:
    """Per entry: copying its bytes into pages that stayed resident, or into pages given
    back with madvise first (the release and the page faults are the difference)."""
    streamer, view, source = expert_memory
    slot = [0]

    def refill() -> None:
        e = slot[0] = (slot[0] + 1) % N_SLOTS
        if release:
            streamer.release_entry(0, e)
        view[e * ENTRY : (e + 1) * ENTRY] = source

    for e in range(N_SLOTS):
        view[e * ENTRY : (e + 1) * ENTRY] = source
    benchmark(refill)
    benchmark.extra_info["entry_bytes"] = ENTRY
