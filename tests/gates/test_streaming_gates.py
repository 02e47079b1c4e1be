"""Expert streaming gates: streamed output equals resident output bit for bit (G1-G3, S2,
S3, the stock oracle), the C cache follows the Python policy exactly, and faults are fatal
and named. Every MoE fixture, the split one included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import pytest

import bmoe.adapters.expert_streaming as expert_streaming_adapter
import bmoe.domain.streaming.rule_chooser as rule_chooser
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.llama.context import FlashAttn
from bmoe.cext import expert_stream
from bmoe.cext.route_recorder import RouteRecorder
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import EngineOptions, ExpertCachePolicy, PageRelease, StreamConfig, StreamCounters
from bmoe.domain.streaming.cache_policy import DEFAULT_EVICTION, Eviction
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


def streamed(
    path: Path,
    *,
    cache_mb: int | None,
    budget_entries: int | None = None,
    policy: str = "fast",
    prefill_ahead: bool = True,
    engine: EngineOptions | None = None,
    eviction: Eviction = DEFAULT_EVICTION,
    pass_layers: bool = False,
    profile: str = "off",
) -> Session:
    stream = StreamConfig(
        enabled=True,
        cache_mb=cache_mb,
        policy=policy,
        prefill_ahead=prefill_ahead,
        engine=engine,
        eviction=eviction,
        pass_layers=pass_layers,
        profile=profile,
    )
    session = Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream))
    assert session.streaming is not None, session.notes
    if budget_entries is not None:
        session.set_cache_budget(0)
        session.streaming.set_budget(budget_entries * session.streaming.info.entry_bytes)
    return session


def same_counters(a: StreamCounters, b: StreamCounters) -> bool:
    """Every counter the policy decides."""
    return a.decisions() == b.decisions()


@pytest.fixture(params=FIXTURES)
def model_path(request: pytest.FixtureRequest, tiny_model_path: TinyModel) -> Path:
    return tiny_model_path(request.param)


@pytest.mark.parametrize("start", ["cold", "warm"])
@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize(
    ("gate", "cache_mb", "budget_entries"),
    [("G1 cache off", 0, None), ("G2 evicting cache", None, 1), ("G3 cache holds all", 1024, None)],
)
def test_streamed_equals_resident(
    model_path: Path,
    gate: str,
    cache_mb: int | None,
    budget_entries: int | None,
    policy: str,
    start: str,
    tmp_path: Path,
) -> None:
    """``warm``: as every run after a model's first (``--profile auto``), the session warms
    its cache from the usage profile an earlier session wrote, and is asked at once (in G2
    the budget then shrinks to one entry while the warm-up's reads run)."""
    tokens, logits = resident(model_path)
    profile = "off"
    if start == "warm":
        profile = str(tmp_path / "profile.json")
        with streamed(model_path, cache_mb=64, profile=profile) as learner:
            assert learner.generate(REQUEST).tokens == tokens
    with streamed(
        model_path, cache_mb=cache_mb, budget_entries=budget_entries, policy=policy, profile=profile
    ) as s:
        assert (s.profile is not None and s.profile.warmed is not None) == (start == "warm" and cache_mb != 0)
        result = s.generate(REQUEST)
        assert result.tokens == tokens, gate
        assert np.array_equal(s.last_logits(), logits), gate
        counters = s.streaming.counters()
        report = result.stream
    assert report is not None and counters.misses + counters.warm_issued > 0  # it read experts
    if gate.startswith("G3"):
        assert counters.evictions == 0
    else:
        assert counters.evictions > 0 and report.decode.evictions > 0  # evicts while decoding


@pytest.mark.parametrize("budget_entries", [0, 1, None])
def test_waiting_for_each_projection_on_a_slow_disk_keeps_the_output_exact(
    model_path: Path, budget_entries: int | None
) -> None:
    """Slow worker lanes, the cache off, evicting, or holding everything (``None``): each
    expert matmul waits only for its own projection while the lanes read the next ones, in
    prefill and decode; tokens and logits equal the resident model's."""
    tokens, logits = resident(model_path)
    slow_lanes = EngineOptions(lane_delay_us=1500)
    with streamed(model_path, cache_mb=None, budget_entries=budget_entries, engine=slow_lanes) as s:
        assert s.streaming is not None
        result = s.generate(REQUEST)
        assert result.tokens == tokens
        assert np.array_equal(s.last_logits(), logits)
        assert s.streaming.counters().projection_waits > 0


@pytest.mark.parametrize("recycle", [True, False])
@pytest.mark.parametrize("release", ["inline", "ahead", "all"])
def test_every_page_release_mode_keeps_the_output_exact(
    model_path: Path, release: PageRelease, recycle: bool
) -> None:
    """Evicted pages moved under the next read's slices (``recycle``) or given back: at once
    (0), reads ahead's through the release ring (1, the default), every eviction's through it
    (2): the same tokens and logits as resident, and each mechanism used exactly when asked."""
    tokens, logits = resident(model_path)
    engine = EngineOptions(page_release=release, page_recycle=recycle)
    with streamed(model_path, cache_mb=None, budget_entries=1, engine=engine) as s:
        assert s.streaming is not None
        result = s.generate(REQUEST)
        assert result.tokens == tokens
        assert np.array_equal(s.last_logits(), logits)
        counters = s.streaming.counters()
    assert counters.evictions > 0
    assert (counters.pages_recycled > 0) == recycle
    if release == "all" and not recycle:
        assert counters.releases_deferred > 0
    if release == "inline":
        assert counters.releases_deferred == 0


@pytest.mark.parametrize("pass_layers", [False, True])
@pytest.mark.parametrize("eviction", ["lfu", "slru", "lru", "adaptive"])
@pytest.mark.parametrize("budget_entries", [0, 3, 1000])
def test_the_reference_policy_and_the_fast_path_agree_on_everything(
    model_path: Path, budget_entries: int, eviction: Eviction, pass_layers: bool
) -> None:
    """Tokens, logits, every counter and the eviction order, over two requests (a warm
    cache) and a perplexity (one all-rows prefill), under either eviction, layers held
    whole passed or not."""
    runs = {}
    for policy in ("fast", "reference"):
        with streamed(
            model_path,
            cache_mb=None,
            budget_entries=budget_entries,
            policy=policy,
            eviction=eviction,
            pass_layers=pass_layers,
        ) as s:
            assert s.streaming.streaming.streamer.eviction == eviction
            first = s.generate(GenerateRequest("Warm the cache up with something else", n_predict=6))
            second = s.generate(REQUEST)
            ppl = s.perplexity(PROMPT)
            runs[policy] = (
                first.tokens,
                second.tokens,
                s.last_logits(),
                ppl.logp,
                s.streaming.counters(),
                s.streaming.resident_entries(),
                second.stream,
            )
    fast, ref = runs["fast"], runs["reference"]
    assert (fast[4].passed > 0) == (pass_layers and budget_entries == 1000)  # a layer held whole
    assert fast[:2] == ref[:2]
    assert np.array_equal(fast[2], ref[2]) and fast[3] == ref[3]
    assert same_counters(fast[4], ref[4])
    assert fast[5] == ref[5]
    assert fast[6] is not None and ref[6] is not None
    assert same_counters(fast[6].prefill, ref[6].prefill) and same_counters(fast[6].decode, ref[6].decode)


def adaptive_switches(model_path: Path, budget_entries: int) -> int:
    """Run ``--cache-policy adaptive`` (the window and margin as set) cold (a first request)
    and warm (a second, on what the first left), fast path and reference policy: asserts
    the resident model's output bit for bit in both and that they agree on every decision,
    every switch and every ghost's hits; returns the chooser's switches."""
    warm_request = GenerateRequest("Warm the cache up with something else", n_predict=16)
    cold_tokens = run(SessionConfig(model_path=model_path, context=PARAMS), warm_request).tokens
    tokens, logits = resident(model_path)
    runs = {}
    for policy in ("fast", "reference"):
        with streamed(
            model_path, cache_mb=None, budget_entries=budget_entries, policy=policy, eviction="adaptive"
        ) as s:
            assert s.streaming.streaming.streamer.eviction == "adaptive"
            assert s.generate(warm_request).tokens == cold_tokens
            assert s.generate(REQUEST).tokens == tokens and np.array_equal(s.last_logits(), logits)
            runs[policy] = (s.streaming.counters(), s.streaming.resident_entries())
    fast, ref = runs["fast"], runs["reference"]
    assert same_counters(fast[0], ref[0]) and fast[1] == ref[1]
    assert fast[0].ghost_wanted > 0 and fast[0].cache_rule in ("lru", "slru", "lfu")
    return fast[0].rule_switches


@pytest.mark.parametrize("budget_entries", [3, 12, 24])
def test_the_adaptive_cache_switching_rules_streams_the_resident_output(
    model_path: Path, budget_entries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cache-policy adaptive`` with a window of one token and no margin, so the rule in
    charge changes as often as the ghosts' lead does: streamed == resident, cold and warm,
    and the fast path follows the reference decision for decision (``adaptive_switches``)."""
    monkeypatch.setattr(rule_chooser, "WINDOW_TOKENS", 1)
    monkeypatch.setattr(rule_chooser, "MARGIN_PERMILLE", 0)
    adaptive_switches(model_path, budget_entries)


def test_the_adaptive_gate_is_not_vacuous_the_chooser_switches(
    tiny_model_path: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the gate's window and margin the rule in charge does change on a fixture."""
    monkeypatch.setattr(rule_chooser, "WINDOW_TOKENS", 1)
    monkeypatch.setattr(rule_chooser, "MARGIN_PERMILLE", 0)
    assert adaptive_switches(tiny_model_path("qwen3moe"), 12) > 0


def test_a_cache_of_every_expert_decodes_without_stopping_the_graph(model_path: Path) -> None:
    """Once the cache holds a layer whole, its calls are passed: the graph stops only where a
    request is served, and the output is the resident model's."""
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=None, budget_entries=1000, pass_layers=True) as s:
        streamer = s.streaming.streaming.streamer
        s.generate(GenerateRequest("Warm the cache up with something else", n_predict=6))
        stops, before = streamer.stats()["topk_stops"], s.streaming.counters()
        result = s.generate(REQUEST)
        stops, delta = streamer.stats()["topk_stops"] - stops, s.streaming.counters() - before
        assert result.tokens == tokens and np.array_equal(s.last_logits(), logits)
        assert delta.passed > 0 and stops == delta.requests
    with streamed(model_path, cache_mb=None, budget_entries=1000, pass_layers=False) as s:
        streamer = s.streaming.streaming.streamer
        s.generate(GenerateRequest("Warm the cache up with something else", n_predict=6))
        stops = streamer.stats()["topk_stops"]
        result = s.generate(REQUEST)
        assert result.tokens == tokens and np.array_equal(s.last_logits(), logits)
        assert s.streaming.counters().passed == 0 and streamer.stats()["topk_stops"] > stops


def test_negative_control_without_reads_the_output_changes(model_path: Path) -> None:
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=0) as s:
        s.streaming.streaming.streamer.mode = expert_stream.MODE_OFF  # experts never read: zeros
        result = s.generate(REQUEST)
        assert not np.array_equal(s.last_logits(), logits)
    assert result.tokens != tokens


def test_s2_warm_second_generate_with_an_evicting_cache_equals_the_cold_run(model_path: Path) -> None:
    cold = run(SessionConfig(model_path=model_path, context=PARAMS), REQUEST)
    with streamed(model_path, cache_mb=None, budget_entries=3) as s:
        s.generate(GenerateRequest("Warm the cache up with something else", n_predict=8))
        warm = s.generate(REQUEST)
        assert s.streaming.counters().rereads > 0
    assert warm.tokens == cold.tokens


def test_s3_the_budget_shrinks_between_requests_and_output_stays_exact(model_path: Path) -> None:
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=1024) as s:
        s.generate(REQUEST)
        before = s.streaming.counters().resident_bytes
        s.set_cache_budget(0)
        assert s.streaming.counters().resident_bytes < before
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
def test_the_c_cache_follows_the_python_policy_step_for_step(model_path: Path, budget_entries: int) -> None:
    """Replay: the resident run's recorded routing through the domain policy ends where the
    fast path's C core ends, counter for counter, entry for entry."""
    trace = routing_trace(model_path)
    # the replay models the requests alone: no reads ahead; a layer held whole is passed
    with streamed(
        model_path, cache_mb=None, budget_entries=budget_entries, prefill_ahead=False, pass_layers=True
    ) as s:
        s.generate(REQUEST)
        c_counters = s.streaming.counters()
        c_resident = s.streaming.resident_entries()
        sizes = [s.streaming.streaming.streamer.entry_bytes(layer) for layer in range(s.model.n_layer)]
        entry = s.streaming.info.entry_bytes
        n_expert = s.n_expert
        eviction = s.streaming.streaming.streamer.eviction
    assert eviction == DEFAULT_EVICTION
    policy = ExpertCachePolicy(budget_entries * entry, sizes, n_expert, eviction=eviction)
    for layer, ids in trace:
        if not policy.pass_layer(layer):  # a layer held whole is passed, by the engine too
            policy.request(layer, ids.reshape(-1).tolist())
        policy.check_valid()
    c = policy.counters
    assert (c_counters.requests, c_counters.hits, c_counters.misses, c_counters.evictions) == (
        c.requests,
        c.hits,
        c.misses,
        c.evictions,
    )
    assert c_counters.passed == c.passed
    assert (c.passed > 0) == (budget_entries == 1000)  # only a cache of every expert holds a layer
    assert (c_counters.rereads, c_counters.bytes_read) == (c.rereads, c.bytes_read)
    assert c_resident == policy.resident()


def test_without_room_for_the_mappings_pages_are_given_back_not_recycled(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose slices could exhaust the process's memory mappings (vm.max_map_count)
    streams without recycling, says so, and stays exact."""
    monkeypatch.setattr(expert_streaming_adapter, "recycling_fits", lambda n_slices, limit, in_use: False)
    tokens, logits = resident(model_path)
    with streamed(model_path, cache_mb=None, budget_entries=1) as s:
        assert s.streaming is not None and not s.streaming.info.recycling
        assert any("not recycled" in note and "vm.max_map_count" in note for note in s.notes)
        result = s.generate(REQUEST)
        assert result.tokens == tokens and np.array_equal(s.last_logits(), logits)
        counters = s.streaming.counters()
    assert counters.evictions > 0 and counters.pages_recycled == 0


@pytest.mark.parametrize(("type_k", "type_v", "flash_attn"), [("q8_0", "f16", "off"), ("q8_0", "q8_0", "on")])
def test_a_quantized_kv_cache_streams_as_it_computes_resident(
    tiny_model_path: TinyModel, type_k: str, type_v: str, flash_attn: FlashAttn
) -> None:
    """``-ctk`` / ``-ctv``: a quantized KV cache changes the output (as in llama.cpp); streamed,
    the output is the resident model's with the same cache, bit for bit."""
    path = tiny_model_path("qwen3moe")
    params = attrs.evolve(PARAMS, cache_type_k=type_k, cache_type_v=type_v, flash_attn=flash_attn)
    runs = []
    for stream in (StreamConfig(), StreamConfig(enabled=True, cache_mb=None)):
        with Session.open(SessionConfig(model_path=path, context=params, stream=stream)) as s:
            assert (s.streaming is not None) == stream.enabled
            runs.append((s.generate(REQUEST).tokens, s.last_logits()))
    (resident_tokens, resident_logits), (streamed_tokens, streamed_logits) = runs
    assert streamed_tokens == resident_tokens
    assert np.array_equal(streamed_logits, resident_logits)
    f16 = attrs.evolve(PARAMS, flash_attn=flash_attn)
    with Session.open(SessionConfig(model_path=path, context=f16)) as s:
        s.generate(REQUEST)
        assert not np.array_equal(s.last_logits(), resident_logits)  # the f16 cache computes otherwise
