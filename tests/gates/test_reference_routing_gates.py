"""The decode routing policies in reference mode (``--stream-policy reference``: decided by
``bmoe.domain.streaming.decode_routing`` in Python) equal the fast path (decided in C)
decision for decision, on the core fixtures (softmax, the fused gate_up ``qwen35moe``,
gpt-oss's softmax over the selected logits, deepseek2's sigmoid with a selection bias):

- every policy (in three allowed combinations, so that each runs beside another): the same
  tokens, the same final logits bit for bit (lossy ones too: the same decisions compute the
  same thing), every counter the policies decide (``decisions()``: the prediction's
  per-layer agreement, route-ahead's commits and passes, drops, substitutions, the
  watchdog's checks, and the cache's hits, misses, reads ahead...) and the cache's order,
  over two requests (the token count runs across them) with sampling and an evicting cache;
  each policy must have acted (its counter is not zero);
- the lossless ones (``--predict-log``, ``--predict-prefetch``) leave the reference run's
  output equal to the run without them;
- the lossy ones are deterministic in reference mode (route-ahead 2, a full-strength drop).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import pytest
from gguf import GGUFReader

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import Entry, StreamConfig, StreamCounters
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
WARM_UP = GenerateRequest("Warm up", n_predict=4)
REQUEST = GenerateRequest("Hello, world", n_predict=8, sampling=SamplingParams(temp=1.0, seed=5))
FIXTURES = ["qwen3moe", "qwen35moe", "gpt-oss", "deepseek2"]
EXTRA_ENTRIES = 2  # the cache holds one layer's top-k and this many more: it evicts on every token


@attrs.frozen
class Policies:
    settings: dict[str, object]
    acted: tuple[str, ...]  # counters that must not be 0: each policy acted
    half: bool = False  # a cache of half the experts (some of a layer's own are cached)
    full: bool = False  # a cache of every expert (it fills: cold at first, then all cached)


PREDICT = {"predict_prefetch": True, "predict_log": True}
POLICIES = {  # a drop of 0.75 is a real threshold at top-2 (1.0 drops every cold non-top slot)
    "predict+drop": Policies({**PREDICT, "drop_cold": 0.75}, ("predict_slots", "prefetch_issued")),
    "route-ahead+drop": Policies({"route_ahead": 1, "drop_cold": 1.0}, ("route_ahead_committed", "dropped")),
    "substitute+prefetch": Policies({"substitute": 10.0, "prefetch": 1}, ("substituted",), half=True),
    # the auto gate: shut in a cache that misses on every token, open in one that holds all
    "predict-auto-shut": Policies({**PREDICT, "predict_auto": True}, ("predict_gate_closed",)),
    "predict-auto-open": Policies(
        {**PREDICT, "predict_auto": True}, ("predict_gate_open", "predict_slots"), full=True
    ),
    # the next two MoE layers guessed, one read each: the second guess of a layer adds to the first
    "predict-depth2": Policies(
        {**PREDICT, "predict_depth": 2, "predict_spec_max": 1},
        ("predict_slots", "prefetch_issued"),
        half=True,
    ),
}

Run = tuple[list[int], np.ndarray, StreamCounters, list[Entry]]


def negated_router(path: Path, layer: int) -> np.ndarray:
    """``layer``'s router rows, negated: its top-k is the graph's bottom-k (F32 fixtures)."""
    (tensor,) = [t for t in GGUFReader(path).tensors if t.name == f"blk.{layer}.ffn_gate_inp.weight"]
    return np.ascontiguousarray(-np.asarray(tensor.data, dtype=np.float32))


def run(
    path: Path,
    policy: str,
    *,
    half: bool = False,
    full: bool = False,
    swap_router: int | None = None,
    requests: tuple[GenerateRequest, ...] = (WARM_UP, REQUEST),
    **routing: object,
) -> Run:
    """The requests (two by default) through a small cache; ``swap_router``: the routing
    policies evaluate that layer's router negated (what the graph computes is not what they
    read)."""
    stream = StreamConfig(enabled=True, cache_mb=None, policy=policy, **routing)  # type: ignore[arg-type]
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        if swap_router is not None:
            rows = negated_router(path, swap_router)  # alive until the session closes
            s.streaming.streaming.streamer.set_gate(swap_router, rows.ctypes.data)
        m = s.model
        entries = m.n_layer * m.n_expert // 2 if half else m.n_expert_used + EXTRA_ENTRIES
        if full:
            entries = m.n_layer * m.n_expert
        s.streaming.set_budget(entries * s.streaming.info.entry_bytes)
        tokens = [t for request in requests for t in s.generate(request).tokens]
        return tokens, s.last_logits(), s.streaming.counters(), s.streaming.resident_entries()


def same_output(a: Run, b: Run) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1])


def same_decisions(fast: Run, ref: Run) -> None:
    assert same_output(fast, ref)
    assert fast[2].decisions() == ref[2].decisions()
    assert fast[3] == ref[3]


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("policies", sorted(POLICIES))
def test_the_reference_routing_policies_decide_as_the_fast_path(
    name: str, policies: str, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    p = POLICIES[policies]
    fast = run(path, "fast", half=p.half, full=p.full, **p.settings)
    ref = run(path, "reference", half=p.half, full=p.full, **p.settings)
    same_decisions(fast, ref)
    c = ref[2]
    for counter in p.acted:
        assert getattr(c, counter) > 0, f"{counter} is 0: the policy did not act"
    assert c.decode_slots > 0
    if "route_ahead" in p.settings or "predict_log" in p.settings:
        assert c.watchdog_checks > 0 and c.watchdog_trips == 0


def test_the_prediction_only_reads_ahead_in_reference_mode(tiny_model_path: TinyModel) -> None:
    """G5, G9, G10 in reference mode: the output equals the run without prediction."""
    path = tiny_model_path("qwen3moe")
    predicted = run(path, "reference", **PREDICT)
    assert predicted[2].predict_slots > 0 and predicted[2].prefetch_issued > 0
    assert same_output(predicted, run(path, "fast"))


def test_route_ahead_2_in_reference_mode_decides_as_the_fast_path_and_is_deterministic(
    tiny_model_path: TinyModel,
) -> None:
    """G14b in reference mode, with a horizon of 2 MoE layers."""
    path = tiny_model_path("qwen3moe")
    ref = run(path, "reference", route_ahead=2)
    same_decisions(run(path, "fast", route_ahead=2), ref)
    assert ref[2].route_ahead_committed > 0 and ref[2].route_ahead_passed > 0
    assert same_output(ref, run(path, "reference", route_ahead=2))


def test_a_watchdog_trip_disarms_both_paths_at_the_same_layer_call(tiny_model_path: TinyModel) -> None:
    """Layer 2's router, as the policies read it, ranks the graph's bottom experts first. The
    first routed call is the prompt's last layer (its only token with logits): checked, and
    its router is right. The next check is token 17's: layers 0 and 1 pass it, layer 2 trips
    before committing (its ranking came from the wrong router); everything after passes
    through, in both paths alike."""
    path = tiny_model_path("qwen3moe")
    requests = (GenerateRequest("Hello, world", n_predict=20),)
    fast = run(path, "fast", swap_router=2, requests=requests, route_ahead=1)
    ref = run(path, "reference", swap_router=2, requests=requests, route_ahead=1)
    same_decisions(fast, ref)
    c = ref[2]
    assert (c.watchdog_checks, c.watchdog_trips) == (4, 1)
    assert c.route_ahead_committed == 15 * 3 + 1  # tokens 2-16 at layers 1-3, token 17 at layer 1
    assert c.route_ahead_passed > 0


def test_a_full_strength_drop_in_reference_mode_reads_less_and_keeps_the_top_expert(
    tiny_model_path: TinyModel,
) -> None:
    """G8b, G8c in reference mode: with a top-2 fixture at most one slot of each decode layer
    call is dropped, and the dropped experts are not read."""
    path = tiny_model_path("qwen3moe")
    base, dropped = run(path, "fast"), run(path, "reference", drop_cold=1.0)
    d = dropped[2]
    assert 0 < d.dropped <= d.decode_slots // 2
    assert d.bytes_read < base[2].bytes_read
    assert same_output(dropped, run(path, "reference", drop_cold=1.0))
