"""Gates of the decode routing policies (docs/read-ahead.md; design gates G5, G8a-c, G9,
G10, G14a-b) on every MoE fixture (every registry architecture, the odd-sized slices and the
split file), with sampling (the routing moves) and a cache of a few entries (reads happen):

- lossless settings leave tokens and logits bit-identical to the same streamed run without
  them: the stale-gate prediction log (G9), predictive prefetch (G5, G10, which must also
  have read ahead), dropping at an inert threshold (G8a), route-ahead with a horizon past the
  last layer (G14a: every layer passes through);
- lossy settings are deterministic and do what their counters say: route-ahead 1 commits
  routings and two runs are identical (G14b); a full-strength drop reads less, still
  generates and never drops the top expert (G8b, G8c); substitution serves slots from the
  cache, deterministically;
- the sampled watchdog checks the routers the policies evaluate and never trips here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import EngineOptions, StreamConfig, StreamCounters
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import ARCH_FIXTURES

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
REQUEST = GenerateRequest("Hello, world", n_predict=12, sampling=SamplingParams(temp=1.0, seed=5))
FIXTURES = sorted({*ARCH_FIXTURES.values(), "qwen3moe-odd", "qwen3moe-split"})
EXTRA_ENTRIES = 2  # the cache holds one layer's top-k and this many more: it evicts on every token

Run = tuple[list[int], np.ndarray, StreamCounters]


def run(
    path: Path,
    *,
    half: bool = False,
    lane_delay_us: int = 0,
    orphan_reads: bool = True,
    rank_worker: bool = True,
    projection_waits: bool = True,
    wake_lanes: str = "each",
    **routing: object,
) -> Run:
    """A streamed run whose cache holds one layer's top-k and two entries more (``half``:
    half of all experts, so that a layer finds some of its own experts cached).
    ``lane_delay_us``: the worker lanes read slowly (reads ahead still run when a later plan
    evicts them); ``orphan_reads``: such a victim is left to its lane (the default) or
    waited for; ``rank_worker``: the rankings are made on the worker thread (the default)
    or on the eval thread; ``projection_waits``: each node waits for the expert projection it
    reads (the default) or a layer waits for all of them at its topk."""
    engine = EngineOptions(
        lane_delay_us=lane_delay_us,
        orphan_reads=orphan_reads,
        rank_worker=rank_worker,
        projection_waits=projection_waits,
        wake_lanes=wake_lanes,  # type: ignore[arg-type]
    )
    stream = StreamConfig(enabled=True, cache_mb=None, engine=engine, **routing)  # type: ignore[arg-type]
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        m = s.model
        entries = m.n_layer * m.n_expert // 2 if half else m.n_expert_used + EXTRA_ENTRIES
        s.streaming.set_budget(entries * s.streaming.info.entry_bytes)
        result = s.generate(REQUEST)
        return list(result.tokens), s.last_logits(), s.streaming.counters()


def same_output(a: Run, b: Run) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1])


@pytest.fixture(scope="module")
def baselines() -> dict[Path, Run]:
    return {}


@pytest.fixture(params=FIXTURES)
def fixture(
    request: pytest.FixtureRequest, tiny_model_path: TinyModel, baselines: dict[Path, Run]
) -> tuple[Path, Run]:
    path = tiny_model_path(str(request.param))
    if path not in baselines:
        baselines[path] = run(path)
    return path, baselines[path]


def test_lossless_settings_leave_the_output_bit_identical(fixture: tuple[Path, Run]) -> None:
    path, base = fixture
    predicted = run(path, predict_prefetch=True, predict_log=True)  # G5, G9, G10
    assert same_output(predicted, base)
    assert predicted[2].predict_slots > 0
    assert predicted[2].prefetch_issued > base[2].prefetch_issued  # it did speculate
    # its evictions' pages went to its reads, or back to the kernel off its path
    assert predicted[2].pages_recycled + predicted[2].releases_deferred > 0
    inert = run(path, drop_cold=1e-12, route_ahead=1000)  # G8a, G14a
    assert same_output(inert, base) and inert[2].dropped == 0
    assert inert[2].route_ahead_committed == 0 and inert[2].route_ahead_passed > 0
    for c in (predicted[2], inert[2]):
        assert c.watchdog_checks > 0 and c.watchdog_trips == 0


def test_evicting_an_entry_still_being_read_keeps_the_output_exact(fixture: tuple[Path, Run]) -> None:
    """Reads ahead on a slow disk: later plans evict entries whose reads still run. Left to
    their lane (the read stops at its next projection and the lane gives the pages back) or
    waited for on the eval thread, the output is the one of a fast disk, and the policy's
    decisions are the same."""
    path, base = fixture
    orphaned = run(path, predict_prefetch=True, lane_delay_us=3000)
    waited = run(path, predict_prefetch=True, lane_delay_us=3000, orphan_reads=False)
    assert same_output(orphaned, base) and same_output(waited, base)
    assert orphaned[2].evict_waits == 0 and waited[2].reads_orphaned == 0
    assert orphaned[2].decisions() == waited[2].decisions()


def test_nodes_that_wait_for_their_own_projection_compute_what_a_fast_disk_gives(
    fixture: tuple[Path, Run],
) -> None:
    """Slow lanes: a layer's reads are still running when its first expert matmul comes.
    Each node that reads an expert projection waits for that projection of the layer's
    experts only, or the layer waits for all of them at its topk: the output is the fast
    disk's either way, and so are the decisions."""
    path, base = fixture
    per_node = run(path, lane_delay_us=2000)
    at_topk = run(path, lane_delay_us=2000, projection_waits=False)
    assert same_output(per_node, base) and same_output(at_topk, base)
    assert per_node[2].projection_waits > 0 and at_topk[2].projection_waits == 0
    assert per_node[2].decisions() == at_topk[2].decisions() == base[2].decisions()


def test_waking_every_lane_or_one_a_read_computes_the_same(fixture: tuple[Path, Run]) -> None:
    """Queued reads wake one waiting worker each (the default) or every worker: slow lanes
    with reads ahead, so that reads queue behind each other; the output and the decisions
    are the fast disk's either way."""
    path, base = fixture
    each = run(path, predict_prefetch=True, lane_delay_us=2000)
    every = run(path, predict_prefetch=True, lane_delay_us=2000, wake_lanes="all")
    assert same_output(each, base) and same_output(every, base)
    assert each[2].decisions() == every[2].decisions()
    assert each[2].prefetch_issued > 0


def test_a_slow_disk_leaves_evicted_reads_to_their_lanes(tiny_model_path: TinyModel) -> None:
    """How often a read is still running when its entry is evicted depends on timing; with
    lanes 10 ms slow per projection it happens on every run here (14-18 times in 12 tokens)."""
    path = tiny_model_path("qwen3moe")
    orphaned = run(path, predict_prefetch=True, lane_delay_us=10_000)[2]
    assert orphaned.reads_orphaned > 0 and orphaned.orphans_cut > 0
    waited = run(path, predict_prefetch=True, lane_delay_us=10_000, orphan_reads=False)[2]
    assert waited.evict_waits > 0


@pytest.mark.parametrize("routing", [{"route_ahead": 1}, {"predict_prefetch": True}], ids=str)
def test_rankings_on_the_worker_or_the_eval_thread_decide_alike(
    fixture: tuple[Path, Run], routing: dict[str, object]
) -> None:
    """The worker ranks while the eval thread serves the layer's load; the reads are issued
    after both, at the same point as without the worker: the same output and decisions."""
    path, _ = fixture
    on, off = run(path, **routing), run(path, rank_worker=False, **routing)
    assert same_output(on, off) and on[2].decisions() == off[2].decisions()
    assert on[2].rank_worker and not off[2].rank_worker
    assert on[2].rank_s > 0 and on[2].rank_wait_s > 0 and off[2].rank_wait_s == 0


def test_route_ahead_commits_deterministically(fixture: tuple[Path, Run]) -> None:
    path, _ = fixture
    committed = run(path, route_ahead=1)  # G14b
    assert same_output(committed, run(path, route_ahead=1))
    c = committed[2]
    assert c.route_ahead_committed > 0 and c.watchdog_trips == 0
    assert 0 <= c.route_ahead_agree <= c.route_ahead_slots


CORE = ["qwen3moe", "qwen35moe", "gpt-oss", "deepseek2"]  # softmax, fused gate_up, softmax-weight, sigmoid


@pytest.mark.parametrize("name", CORE)
def test_the_prediction_log_alone_only_observes(name: str, tiny_model_path: TinyModel) -> None:
    path = tiny_model_path(name)
    base, logged = run(path), run(path, predict_log=True)  # G9
    assert same_output(logged, base)
    assert logged[2].predict_slots > 0 and logged[2].prefetch_issued == base[2].prefetch_issued


@pytest.mark.parametrize("name", CORE)
def test_dropping_and_substituting_are_deterministic_and_counted(
    name: str, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    base = run(path)
    dropped = run(path, drop_cold=1.0)  # G8b, G8c
    d = dropped[2]
    assert len(dropped[0]) == len(base[0])
    assert d.dropped > 0 and d.bytes_read < base[2].bytes_read
    assert d.dropped < d.decode_slots  # the top expert of every layer call was kept
    assert same_output(dropped, run(path, drop_cold=1.0))
    swapped = run(path, half=True, substitute=10.0)
    assert swapped[2].substituted > 0
    assert same_output(swapped, run(path, half=True, substitute=10.0))


def test_the_top_expert_is_never_dropped(tiny_model_path: TinyModel) -> None:
    """G8c with the counts: at full strength with a top-2 fixture at most one slot of each
    decode layer call is dropped, so at most half the decode slots."""
    path = tiny_model_path("qwen3moe")
    d = run(path, drop_cold=1.0)[2]
    assert 0 < d.dropped <= d.decode_slots // 2
